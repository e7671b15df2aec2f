"""The trainer image: the exact build source, the CodeBuild build as a dynamic resource, and
the component that pins the job to the image's digest."""
