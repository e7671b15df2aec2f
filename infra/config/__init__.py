"""The typed, validated stack config: the single source of truth for every component."""
