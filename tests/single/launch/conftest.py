import pytest

from support.commands import no_launch


@pytest.fixture(autouse=True)
def nothing_launched(monkeypatch):
    """hvdtrain runs in the test process here: none of it may start a job."""
    no_launch(monkeypatch)
