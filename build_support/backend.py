"""setuptools' build backend, plus the start-up hook in every wheel it builds (regular and editable installs).

``hasten-as-accelerate.pth`` lands in site-packages beside the package: Python runs its one line at start-up, and it
does nothing unless ``HASTEN_AS_ACCELERATE`` asks for the switch (then it imports hasten, which installs it; see
``src/hasten/as_accelerate/``). pip lists the file in the wheel's RECORD, so uninstalling removes it.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zipfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every hook not redefined here is setuptools' own

HOOK_NAME = "hasten-as-accelerate.pth"
HOOK_LINE = ('import os; os.environ.get("HASTEN_AS_ACCELERATE", "").strip().lower() not in ("", "0", "false") '
             'and __import__("hasten")\n')


def _with_hook(wheel_directory: str, wheel_name: str) -> str:
    path = os.path.join(wheel_directory, wheel_name)
    with zipfile.ZipFile(path) as wheel:
        entries = [(info, wheel.read(info.filename)) for info in wheel.infolist()]
    data = HOOK_LINE.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for info, content in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                content += f"{HOOK_NAME},sha256={digest},{len(data)}\n".encode()
            wheel.writestr(info, content)
        wheel.writestr(HOOK_NAME, data)
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _with_hook(wheel_directory, _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _with_hook(wheel_directory, _setuptools.build_editable(wheel_directory, config_settings,
                                                                  metadata_directory))
