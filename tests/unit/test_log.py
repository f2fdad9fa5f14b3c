from __future__ import annotations

import json
import logging

import pytest

from shared.log import configure_logging, get_logger


def test_logs_are_json_lines_with_service_and_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("svc_test", level="INFO", fmt="json")
    get_logger("t").info("trial.completed", trial_id="s1-t3", value=0.05)
    get_logger("t").debug("too.chatty")
    logging.getLogger("librdkafka").warning("from the stdlib")
    lines = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]
    assert lines[0]["event"] == "trial.completed"
    assert lines[0]["service"] == "svc_test" and lines[0]["trial_id"] == "s1-t3"
    assert lines[0]["level"] == "info"
    assert [entry["event"] for entry in lines] == ["trial.completed", "from the stdlib"]
