"""Configuration: settings and YAML files, the integer rule, host names and bounded name lookups."""
