"""Programs shipped into pods as text (a ConfigMap), never imported by the Pulumi program: they
run with the trainer image's torch, which the pure wings must not import."""
