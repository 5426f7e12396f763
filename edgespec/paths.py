"""Every place edgespec reads or writes on disk, decided once.

Locations follow each platform's convention and are resolved at call time, so an environment
variable set by a test or an app after import still counts:

- cache (rebuildable: model files, calibration): ``$XDG_CACHE_HOME/edgespec``, default
  ``~/.cache/edgespec`` on every platform (as the Hugging Face cache beside it);
- data (the user's own: chat input history): ``$XDG_DATA_HOME/edgespec`` (default
  ``~/.local/share/edgespec``; macOS ``~/Library/Application Support/edgespec``; Windows
  ``%APPDATA%\\edgespec``).

``EDGESPEC_MODELS`` moves the models folder. Files from the Hugging Face hub stay in the hub's
own cache, shared with every other hub tool, found as the hub client finds it
(:func:`hub_cache_dir`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP = "edgespec"


def cache_dir() -> Path:
    """Rebuildable files: model files fetched or derived, calibration."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / APP


def data_dir() -> Path:
    """Files that belong to the user (the chat's input history)."""
    if sys.platform == "win32":
        base = os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming"
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / APP


def models_dir() -> Path:
    """Where wheel and derived models are stored: ``$EDGESPEC_MODELS`` or
    ``<cache>/models``."""
    env = os.environ.get("EDGESPEC_MODELS")
    return Path(env).expanduser() if env else cache_dir() / "models"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (the hub client's own rule)."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(os.path.expandvars(env[var])).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache",
                                              "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def hub_stamps_dir() -> Path:
    """Verification stamps of hub files (which cached blob was hashed, and its sha256)."""
    return models_dir() / ".hub-verified"


def calibration_file() -> Path:
    """Measured model costs, per model file and settings (see ``drafting/cost_cache.py``)."""
    return cache_dir() / "calibration.json"


def cpu_check_file() -> Path:
    """The preflight's verdicts on CPU code paths that fault, per CPU, kernel and llama.cpp
    build (``backend/preflight.py``)."""
    return cache_dir() / "cpu_check.json"


def chat_history_file() -> Path:
    """What was typed in ``edgespec chat`` (kept private: mode 0600)."""
    return data_dir() / "chat_history"
