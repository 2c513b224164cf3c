"""Every test here runs twice: on a SQLite file and on a real PostgreSQL database."""

from tests.pg import backend, database_url, db, postgres_server

__all__ = ["backend", "database_url", "db", "postgres_server"]  # fixtures, re-exported for pytest
