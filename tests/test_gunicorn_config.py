"""gunicorn.conf.py: what every gunicorn worker of the app does once it has loaded the app."""

from __future__ import annotations

import gc
import runpy
from pathlib import Path

from flask import Flask
from gunicorn import util

CONFIG = Path(__file__).resolve().parent.parent / "gunicorn.conf.py"


def test_a_worker_freezes_what_start_up_built_out_of_full_collections(app):
    hooks = runpy.run_path(str(CONFIG))
    gc.unfreeze()
    try:
        hooks["post_worker_init"](worker=None)

        # The app and everything imported are now in the permanent generation: a full
        # collection no longer walks them, and they stay alive as the worker does.
        frozen = gc.get_freeze_count()
        assert frozen > 10_000
        assert len(gc.get_objects()) < frozen / 10
    finally:
        gc.unfreeze()


def test_a_worker_answers_gunicorns_refusals_in_the_envelope_whatever_app_it_serves(monkeypatch):
    """The hook needs nothing of the app but its settings, when it has them: the benchmarks'
    stand-in app boots under this file too."""
    hooks = runpy.run_path(str(CONFIG))
    monkeypatch.setattr(util, "write_error", util.write_error)  # put back after the test
    html_writer = util.write_error
    hooks["_answer_refusals_in_the_envelope"](Flask("a stand-in"))
    assert util.write_error is not html_writer
