"""`tandem serve`: a whole PD deployment (workers + gateway) from one command."""

from tandem.serve.cli import add_serve_parser

__all__ = ["add_serve_parser"]
