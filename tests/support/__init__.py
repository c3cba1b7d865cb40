"""The suite's shared helpers: tables, runners, peers, storage hooks and S3 stand-ins (one package, imported
as `support.<module>`; tests/conftest.py puts tests/ on sys.path for child processes too)."""
