"""Shared fixtures: the real local stand-ins live in tests/fixtures/, one module each."""

pytest_plugins = [
    "tests.fixtures.sshd",
    "tests.fixtures.moto_server",
    "tests.fixtures.gcs_emulator",
    "tests.fixtures.fake_gce",
]
