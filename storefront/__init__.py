"""The composition root above every layer: the root URLconf mounts each app's pages. Apps
never import it (import-linter's layers contract in pyproject.toml)."""
