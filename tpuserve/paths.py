"""Where the project's data lives: the repository root, its config and its templates."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "config"
DEFAULT_CONFIG = CONFIG_DIR / "default.toml"
TEMPLATE_DIR = REPO_ROOT / "templates"
