from tests.core.conftest import gcs, gcs_server_url  # noqa: F401  (the same fake store)
