"""lmsviz: the local web app over lmscore (layout, callbacks and figure builders only)."""
