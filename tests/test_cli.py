"""Support's commands (CONTRACT section 2): stdout carries only the value; errors are one line on
stderr with a non-zero exit, and change nothing."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta

import pytest
from sqlalchemy import func, select

from extensions import db
from models import BootstrapToken, Brand
from models.columns import utcnow
from services.bootstrap_tokens import DEFAULT_TTL_HOURS, find_valid_bootstrap_token
from tests.helpers import assert_success

BRAND_ID = re.compile(r"^brd_[0-9a-z]{26}$")
TOKEN = re.compile(r"^bst_[0-9A-Za-z]{38}$")


def invoke(runner, *args):
    return runner.invoke(args=list(args), catch_exceptions=False)


def test_brands_create_prints_only_the_id(app, runner):
    result = invoke(runner, "brands", "create", "Acme Foods", "--plan", "enterprise")
    assert result.exit_code == 0, result.output
    assert BRAND_ID.match(result.stdout.strip())
    assert result.stdout.count("\n") == 1
    with app.app_context():
        brand = db.session.get(Brand, result.stdout.strip())
        assert (brand.name, brand.plan, brand.kyb_status) == ("Acme Foods", "enterprise", "pending")
        assert brand.subscription_period_end > brand.subscription_period_start


def test_brands_create_defaults_to_the_starter_plan(app, runner):
    brand_id = invoke(runner, "brands", "create", "Small Shop").stdout.strip()
    with app.app_context():
        assert db.session.get(Brand, brand_id).plan == "starter"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["brands", "create", "X", "--plan", "platinum"], "platinum"),
        (["brands", "create", "   "], "name"),
        (["brands", "create", "x" * 101], "name"),
    ],
)
def test_brands_create_refuses_bad_input_and_creates_nothing(app, runner, args, fragment):
    result = runner.invoke(args=args)
    assert result.exit_code != 0
    assert result.stdout == ""
    assert fragment in result.stderr
    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(Brand)) == 0


def test_brands_list_prints_a_table(runner, make_brand, make_key):
    first = make_brand("First Brand")
    second = make_brand("Second Brand")
    make_key(second)
    lines = invoke(runner, "brands", "list").stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "PLAN", "KYB"]
    assert first in lines[1] and "First Brand" in lines[1]
    assert second in lines[2] and re.search(r"\s1\s", lines[2])  # one active key


def test_issue_bootstrap_token_prints_only_a_working_token(runner, client, brand):
    result = invoke(runner, "brands", "issue-bootstrap-token", brand, "--ttl-hours", "2")
    assert result.exit_code == 0
    token = result.stdout.strip()
    assert TOKEN.match(token)
    assert "Shown once" in result.stderr
    response = client.post(
        f"/api/v1/brand/{brand}/api-key/create-key",
        json={"name": "from the CLI"},
        headers={"X-Service-Bootstrap-Token": token},
    )
    assert_success(response, 201)


def test_issued_token_expires_after_its_ttl(app, runner, brand):
    token = invoke(
        runner, "brands", "issue-bootstrap-token", brand, "--ttl-hours", "3"
    ).stdout.strip()
    with app.app_context():
        record = db.session.scalar(select(BootstrapToken))
        lifetime = record.expires_at - record.created_at
        assert lifetime.total_seconds() == 3 * 3600
        assert find_valid_bootstrap_token(token, record.expires_at) is None
        assert find_valid_bootstrap_token(token, utcnow()) is not None


@pytest.mark.parametrize("ttl", ["0", "-1", "721"])
def test_issue_bootstrap_token_refuses_a_bad_ttl(app, runner, brand, ttl):
    result = runner.invoke(args=["brands", "issue-bootstrap-token", brand, "--ttl-hours", ttl])
    assert result.exit_code != 0 and result.stdout == ""
    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(BootstrapToken)) == 0


@pytest.mark.parametrize(
    "command", [["brands", "issue-bootstrap-token"], ["brands", "revoke-bootstrap-tokens"]]
)
def test_unknown_brand_is_a_one_line_error(runner, command):
    result = runner.invoke(args=[*command, "brd_nosuchbrand"])
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0
    assert "brd_nosuchbrand" in result.stderr


def test_revoke_bootstrap_tokens_counts_and_revokes_only_valid_ones(
    runner, client, brand, make_bootstrap_token, make_brand
):
    tokens = [make_bootstrap_token(brand) for _ in range(2)]
    other_brand = make_brand("Other")
    other_brand_token = make_bootstrap_token(other_brand)
    result = invoke(runner, "brands", "revoke-bootstrap-tokens", brand)
    assert result.stdout.strip() == "2"
    assert invoke(runner, "brands", "revoke-bootstrap-tokens", brand).stdout.strip() == "0"
    for token in tokens:
        response = client.post(
            f"/api/v1/brand/{brand}/api-key/create-key",
            json={"name": "x"},
            headers={"X-Service-Bootstrap-Token": token},
        )
        assert response.status_code == 401
    response = client.post(
        f"/api/v1/brand/{other_brand}/api-key/create-key",
        json={"name": "still fine"},
        headers={"X-Service-Bootstrap-Token": other_brand_token},
    )
    assert_success(response, 201)  # another brand's tokens are neither counted nor revoked


def test_demo_seed_prints_a_brand_and_a_working_token(runner, client):
    result = invoke(runner, "demo", "seed")
    seeded = json.loads(result.stdout)
    assert set(seeded) == {"brandId", "bootstrapToken", "bootstrapTokenExpiresAt", "linkCode"}
    expires = datetime.fromisoformat(seeded["bootstrapTokenExpiresAt"].replace("Z", "+00:00"))
    assert abs(expires - utcnow() - timedelta(hours=DEFAULT_TTL_HOURS)) < timedelta(minutes=1)
    # The token makes as many keys as wanted until it expires, as make run's banner says.
    for name in ("demo", "another"):
        response = client.post(
            f"/api/v1/brand/{seeded['brandId']}/api-key/create-key",
            json={"name": name},
            headers={"X-Service-Bootstrap-Token": seeded["bootstrapToken"]},
        )
        assert_success(response, 201)


def test_demo_seed_if_empty_seeds_only_the_first_time(runner):
    assert json.loads(invoke(runner, "demo", "seed", "--if-empty").stdout)["brandId"]
    assert invoke(runner, "demo", "seed", "--if-empty").stdout == ""


def test_help_states_the_limits(runner):
    token_help = runner.invoke(args=["brands", "issue-bootstrap-token", "--help"]).output
    assert "1-720 (30 days)" in token_help
    assert "default: 24" in token_help
    # How long a token lasts, and that it mints more than one key, said where support looks.
    said = " ".join(token_help.split())
    assert "as many as you like, until it expires, 24 hours after it is issued" in said
    create_help = runner.invoke(args=["brands", "create", "--help"]).output
    assert "1-100 characters" in create_help
    assert "starter|growth|enterprise" in create_help.replace(" ", "")


def _command_summaries(runner, group: list[str]) -> list[str]:
    """The lines of a group's `--help` listing its commands, as an 80-column terminal shows."""
    listing = runner.invoke(args=[*group, "--help"], terminal_width=80).output
    return listing.split("Commands:\n", 1)[1].splitlines()


def test_every_commands_one_line_summary_fits_without_being_cut(app, runner):
    """`flask --app app --help` and each group's list every command with a summary that is
    whole: Click cuts one that does not fit with "...", mid-sentence."""
    ours = [["brands"], ["demo"], ["events"], ["endpoints"], ["secrets"]]
    lines = _command_summaries(runner, [])
    for group in ours:
        lines += _command_summaries(runner, group)
    cut = [line.strip() for line in lines if line.rstrip().endswith("...")]
    assert cut == []
    assert any(line.split()[0] == "worker" for line in lines[:20])
    assert sum(1 for line in lines if line.strip()) >= 17  # every command was listed
