"""The bundle on disk: graph I/O names, the manifest, the shared weights file, safe installation."""
