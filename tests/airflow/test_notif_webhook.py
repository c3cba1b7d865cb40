"""The webhook notifier: a Slack-style JSON POST to the URL in a connection, templated text, and failures
that name the connection but never the (secret) URL."""

from __future__ import annotations

import json

import pytest
from lag_support import WebhookReceiver

from memwal.airflow.notifications.webhook import MemWalWebhookNotifier, WebhookError, WebhookHook

ALERT = {
    "state": "firing", "table": "orders", "text": "[FIRING] MemWAL table orders is behind: region r1: x 5 > 4",
    "breaches": [{"key": "r1:unmerged_generations", "region_id": "r1", "metric": "unmerged_generations",
                  "value": 5, "threshold": 4, "message": "region r1: unmerged_generations 5 > 4"}],
}


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


def test_posts_slack_style_json_to_the_connection_url(receiver, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAG_HOOK", json.dumps({"conn_type": "http", "host": receiver.url()}))
    MemWalWebhookNotifier(webhook_conn_id="lag_hook")({"memwal_alert": ALERT})
    (body,) = receiver.posts
    assert receiver.paths == ["/hook/T000/B000/s3cr3t"]
    assert body["text"] == ALERT["text"], "default text is the alert's text"
    assert body["attachments"][0]["color"] == "danger"
    fields = {f["title"]: f["value"] for f in body["attachments"][0]["fields"]}
    assert fields["table"] == "orders" and fields["r1"] == "region r1: unmerged_generations 5 > 4"
    assert body["memwal"]["breaches"][0]["value"] == 5


def test_template_fields_render_from_the_context(receiver, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAG_HOOK2", receiver.url("/services/abc"))  # URI form: path -> schema
    notifier = MemWalWebhookNotifier(webhook_conn_id="lag_hook{{ 1 + 1 }}",
                                     text="{{ memwal_alert.table }} is {{ memwal_alert.state }}",
                                     fields={"runbook": "https://wiki/{{ memwal_alert.table }}"})
    notifier({"memwal_alert": {**ALERT, "state": "resolved", "breaches": []}})
    (body,) = receiver.posts
    assert receiver.paths == ["/services/abc"]
    assert body["text"] == "orders is resolved" and body["attachments"][0]["color"] == "good"
    assert {"title": "runbook", "value": "https://wiki/orders", "short": True} in body["attachments"][0]["fields"]


def test_failure_names_the_connection_not_the_url(receiver, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAG_HOOK3", json.dumps({"conn_type": "http", "host": receiver.url()}))
    receiver.fail_with = 500
    with pytest.raises(WebhookError) as err:
        MemWalWebhookNotifier(webhook_conn_id="lag_hook3")({"memwal_alert": ALERT})
    assert "lag_hook3" in str(err.value) and "500" in str(err.value)
    assert "s3cr3t" not in str(err.value) and err.value.__cause__ is None


def test_connection_without_url_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAG_EMPTY", json.dumps({"conn_type": "http"}))
    with pytest.raises(WebhookError, match=r"lag_empty.*has no webhook URL"):
        WebhookHook("lag_empty").post({"text": "x"})


def test_url_from_extra_wins(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_LAG_EXTRA", json.dumps(
        {"conn_type": "generic", "host": "ignored", "extra": {"webhook_url": "https://hooks.example/services/X"}}))
    conn = WebhookHook.get_connection("lag_extra")
    assert WebhookHook.url_from_connection(conn) == "https://hooks.example/services/X"


def test_notifiers_for_a_table_follow_its_alerts_settings(receiver, monkeypatch):
    from types import SimpleNamespace

    from memwal.airflow.alerts import notifiers_for

    none = notifiers_for(SimpleNamespace(name="t"))
    assert none == [], "no memwal_alerts connection and nothing configured: no notifier"
    monkeypatch.setenv("AIRFLOW_CONN_MEMWAL_ALERTS", json.dumps({"conn_type": "http", "host": receiver.url()}))
    (default,) = notifiers_for(SimpleNamespace(name="t"))
    assert default.webhook_conn_id == "memwal_alerts"
    cfg = SimpleNamespace(name="t", alerts={"webhook_conn_id": "", "notifiers": [
        {"class": "memwal.airflow.notifications.webhook.MemWalWebhookNotifier", "kwargs": {"webhook_conn_id": "b"}}]})
    (only,) = notifiers_for(cfg)
    assert only.webhook_conn_id == "b", "an empty webhook_conn_id turns the default webhook off"


def test_async_notify_posts_the_same_payload(receiver, monkeypatch):
    """Awaited (as the triggerer runs notifiers), the notifier renders its templates and POSTs once."""
    import asyncio

    monkeypatch.setenv("AIRFLOW_CONN_LAG_HOOK4", json.dumps({"conn_type": "http", "host": receiver.url()}))
    notifier = MemWalWebhookNotifier(webhook_conn_id="lag_hook4",
                                     text="{{ memwal_alert.table }}: {{ memwal_alert.state }}")
    notifier.context = {"memwal_alert": ALERT}

    async def main():
        await notifier

    asyncio.run(main())
    (body,) = receiver.posts
    assert body["text"] == "orders: firing" and body["memwal"]["table"] == "orders"


def test_a_bad_alerts_entry_names_the_table_and_key():
    from types import SimpleNamespace

    from memwal.airflow.alerts import notifiers_for

    with pytest.raises(ValueError, match=r"table 'orders': unknown key alerts\.webhook_con_id"):
        notifiers_for(SimpleNamespace(name="orders", alerts={"webhook_con_id": "x"}))
    with pytest.raises(ValueError, match=r"table 'orders': alerts\.notifiers must be a list"):
        notifiers_for(SimpleNamespace(name="orders", alerts={"notifiers": "mycompany.Notifier"}))
