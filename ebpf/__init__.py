"""bcc programs (C text) and their thin Python loaders."""
