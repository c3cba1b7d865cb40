"""A generic webhook notifier for lag alerts: one JSON POST in the shape Slack-style incoming webhooks
accept (`text`, plus `attachments[].fields` and a machine-readable `memwal` object), to the URL kept in an
Airflow Connection (the URL is a secret: it is masked in logs and never rendered into a template field).

The connection (conn type `http`, or the generic one) gives the URL as, in order: extra `webhook_url`;
the host when it holds a full URL (`https://hooks.slack.com/services/T/B/X`); or
`{conn_type http|https}://host[:port][/schema]` (what `AIRFLOW_CONN_X='http://host:port/path'` parses to).

Any other Airflow notifier works in its place in the lag monitor: it receives the task context with a
`memwal_alert` entry (see `memwal.airflow.alerts`), usable in its templates as `{{ memwal_alert.text }}`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import httpx
from airflow.sdk import BaseHook, BaseNotifier

__all__ = ["DEFAULT_WEBHOOK_CONN_ID", "MemWalWebhookNotifier", "WebhookError", "WebhookHook", "send_webhook"]

DEFAULT_WEBHOOK_CONN_ID = "memwal_alerts"
DEFAULT_TEXT = "{{ memwal_alert.text if memwal_alert is defined else 'Airflow notification from ' ~ dag.dag_id }}"


class WebhookError(RuntimeError):
    """The webhook POST failed; the message names the connection and the status, never the URL."""


class WebhookHook(BaseHook):
    """POSTs JSON to the webhook URL of a connection (resolved lazily, on the first post)."""

    conn_name_attr = "webhook_conn_id"
    default_conn_name = DEFAULT_WEBHOOK_CONN_ID
    conn_type = "http"
    hook_name = "Webhook"

    def __init__(self, webhook_conn_id: str = DEFAULT_WEBHOOK_CONN_ID, timeout_s: float = 10.0) -> None:
        super().__init__()
        self.webhook_conn_id = webhook_conn_id
        self.timeout_s = timeout_s

    @staticmethod
    def url_from_connection(conn: Any) -> str:
        extra = conn.extra_dejson or {}
        url = extra.get("webhook_url") or extra.get("url")
        host = (conn.host or "").strip()
        if not url and "://" in host:
            url = host
        if not url and host:
            scheme = conn.conn_type if conn.conn_type in ("http", "https") else "https"
            url = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
            if conn.schema:
                url += "/" + conn.schema.lstrip("/")
        if not url:
            raise WebhookError(f"connection {conn.conn_id!r} has no webhook URL: set its host to the full URL "
                               "or its extra to {\"webhook_url\": \"https://...\"}")
        return url

    def _url(self, conn: Any) -> str:
        from airflow.sdk.log import mask_secret

        url = self.url_from_connection(conn)
        mask_secret(url)
        return url

    def post(self, payload: Mapping[str, Any]) -> int:
        """POST the payload; returns the HTTP status. WebhookError (without the URL) on failure."""
        url = self._url(self.get_connection(self.webhook_conn_id))
        try:
            response = httpx.post(url, json=dict(payload), timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise WebhookError(f"webhook {self.webhook_conn_id}: POST failed ({type(exc).__name__})") from None
        return self._check(response)

    async def apost(self, payload: Mapping[str, Any]) -> int:
        """Async `post` (for notifiers run in the triggerer)."""
        url = self._url(await self.aget_connection(self.webhook_conn_id))
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                response = await client.post(url, json=dict(payload))
        except httpx.HTTPError as exc:
            raise WebhookError(f"webhook {self.webhook_conn_id}: POST failed ({type(exc).__name__})") from None
        return self._check(response)

    def _check(self, response: httpx.Response) -> int:
        if response.status_code >= 300:
            raise WebhookError(f"webhook {self.webhook_conn_id}: HTTP {response.status_code} "
                               f"{response.text[:200]!r}")
        return response.status_code


def _fields(alert: Mapping[str, Any] | None, extra: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    if alert:
        out.append({"title": "table", "value": str(alert.get("table")), "short": True})
        out.append({"title": "state", "value": str(alert.get("state")), "short": True})
        for b in alert.get("breaches") or []:
            out.append({"title": b.get("region_id") or "table", "value": b.get("message"), "short": False})
    for k, v in (extra or {}).items():
        out.append({"title": str(k), "value": str(v), "short": True})
    return out


def webhook_payload(text: str, alert: Mapping[str, Any] | None, fields: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON body: Slack-style `text` + `attachments[].fields`, and the alert as `memwal`."""
    color = {"firing": "danger", "resolved": "good"}.get((alert or {}).get("state"), "#439FE0")
    return {"text": text, "attachments": [{"color": color, "fields": _fields(alert, fields)}],
            "memwal": dict(alert) if alert else None}


class MemWalWebhookNotifier(BaseNotifier):
    """Sends a lag alert (or any notification) to a Slack-style webhook whose URL is in a connection.

    :param webhook_conn_id: connection holding the webhook URL (templated)
    :param text: message text (templated; default: the alert's text)
    :param fields: extra structured fields, name -> value (templated)
    """

    template_fields: Sequence[str] = ("webhook_conn_id", "text", "fields")

    def __init__(self, *, webhook_conn_id: str = DEFAULT_WEBHOOK_CONN_ID, text: str = DEFAULT_TEXT,
                 fields: Mapping[str, Any] | None = None, timeout_s: float = 10.0) -> None:
        super().__init__()
        self.webhook_conn_id = webhook_conn_id
        self.text = text
        self.fields = dict(fields or {})
        self.timeout_s = timeout_s

    @cached_property
    def hook(self) -> WebhookHook:
        return WebhookHook(webhook_conn_id=self.webhook_conn_id, timeout_s=self.timeout_s)

    def notify(self, context: Any) -> None:
        self.hook.post(webhook_payload(self.text, context.get("memwal_alert"), self.fields))

    async def async_notify(self, context: Any) -> None:
        await self.hook.apost(webhook_payload(self.text, context.get("memwal_alert"), self.fields))


send_webhook = MemWalWebhookNotifier
