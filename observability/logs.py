"""How the service's log lines look: `LOG_FORMAT=text` (the default, for a terminal) or `json`
(one object per line, for a log pipeline). Fields a line carries beyond its message are passed
as `extra=` by whoever logs it (the access line, a delivery attempt) and become keys of its
object; no secret is ever passed, so none can appear."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Loggers that write the service's lines: ours, RQ's (the worker) and gunicorn's own.
SERVICE_LOGGERS = ("brand_api", "rq")
_STANDARD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then the record's extras."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD_ATTRIBUTES and not name.startswith("_"):
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def formatter_for(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(log_format: str) -> None:
    """A handler on each service logger, unless a host already gave it one. In text mode RQ keeps
    its own colourful lines; in JSON mode every line of the process is an object."""
    names = SERVICE_LOGGERS if log_format == "json" else SERVICE_LOGGERS[:1]
    for name in names:
        logger = logging.getLogger(name)
        if logger.handlers:
            continue
        handler = logging.StreamHandler()
        handler.setFormatter(formatter_for(log_format))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def gunicorn_logconfig(log_format: str) -> dict | None:
    """gunicorn's `logconfig_dict` for JSON mode (its error log as objects too); None keeps its
    own text format."""
    if log_format != "json":
        return None
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "observability.logs.JsonFormatter"}},
        "handlers": {"console": handler},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": ["console"], "propagate": False},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": False},
        },
    }
