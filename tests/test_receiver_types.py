"""The README's "Types for your receiver", word for word: fetch the document from a running
server, generate pydantic models with datamodel-code-generator, and parse every event's body with
the README's Python lines. (`pip install datamodel-code-generator` is not run: it is a dev
dependency of this repository.)"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from models.event_catalog import EVENT_NAMES
from tests.event_schemas import contract_of, sample_body

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "### Types for your receiver"


def readme_blocks(language: str) -> list[str]:
    section = README.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


@pytest.fixture
def served(app) -> Iterator[str]:
    """The app on a free port of 127.0.0.1 (the document needs no database)."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_readmes_commands_generate_types_that_parse_every_event(app, served, tmp_path):
    [commands] = readme_blocks("console")
    lines = [line for line in commands.splitlines() if line.strip()]
    assert lines[0] == "pip install datamodel-code-generator"
    environ = os.environ | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for line in lines[1:]:
        command = line.replace("127.0.0.1:5000", served)
        finished = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            check=False,
        )
        assert finished.returncode == 0, (command, finished.stderr)
    document = json.loads((tmp_path / "brand-api.json").read_text())
    assert document["openapi"] == "3.1.0" and set(document["webhooks"]) == set(EVENT_NAMES)

    [snippet] = readme_blocks("python")
    sys.path.insert(0, str(tmp_path))
    try:
        for name in EVENT_NAMES:
            printed = io.StringIO()
            namespace: dict[str, Any] = {"raw_body": json.dumps(sample_body(name))}
            with contextlib.redirect_stdout(printed):
                exec(snippet, namespace)  # noqa: S102 - the README's own lines
            event = namespace["event"]
            assert type(event).__name__ == contract_of(app).body_schema_ref(name).rsplit("/")[-1]
            assert event.type == name
            assert event.sequence == 1
            assert event.subject.type == sample_body(name)["subject"]["type"]
            if name == "deal.completed":
                deal_id = sample_body(name)["subject"]["id"]
                assert printed.getvalue() == f"45000000\n{deal_id} 1\n"
        # The generated models are as strict as the schemas: a field they do not know fails.
        unknown = sample_body("deal.completed")
        unknown["data"]["reviewer"] = "ops"
        with pytest.raises(Exception, match="reviewer"):
            exec(snippet, {"raw_body": json.dumps(unknown)})  # noqa: S102
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("brand_events", None)
