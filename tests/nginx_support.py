"""Where Debian's nginx is: /usr/sbin is not on a minimal PATH (a stranger's shell, CI)."""

from __future__ import annotations

import os
import shutil

NGINX: str | None = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)
