"""``python -m lmsviz``: serve the web app (see :func:`lmsviz.app.main`)."""

import sys

from .app import main

sys.exit(main())
