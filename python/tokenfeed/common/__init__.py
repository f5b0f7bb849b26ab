"""Shared by every room: the package's exceptions and warnings, run locks, progress lines, install hints, build
information. Imports nothing of the package but the extension module."""
