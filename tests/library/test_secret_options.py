"""is_secret_option against every configuration key obstore (and so Lance's object_store) accepts, and
redact() on Spark confs (issue 23, item 8). The keys come from obstore's own type stubs, so a key a new
obstore adds fails here until it is classified below."""

from __future__ import annotations

import ast
from pathlib import Path

import obstore
import pytest
from obstore import exceptions as obx
from obstore.store import AzureStore, GCSStore, S3Store

from memwal.storage import is_secret_option
from spark_jobs.submit import redact

STUBS = Path(obstore.__file__).parent / "_store"

# Keys of obstore's config TypedDicts whose value is a credential (or where one is read from).
SECRET = {
    "S3Config": {"access_key_id", "secret_access_key", "session_token", "sse_customer_key_base64",
                 "container_authorization_token_file", "web_identity_token_file"},
    "S3Credential": {"access_key_id", "secret_access_key", "token"},
    "AzureConfig": {"account_key", "client_secret", "sas_key", "token", "fabric_session_token", "encryption_key",
                    "federated_token_file"},
    "AzureAccessKey": {"access_key"},
    "AzureSASToken": {"sas_token"},
    "AzureBearerToken": {"token"},
    "GCSConfig": {"service_account", "service_account_key", "bearer_token", "application_credentials"},
    "GCSCredential": {"token"},
    "ClientConfig": set(),
    "RetryConfig": set(),
    "BackoffConfig": set(),
}

# The same keys as Lance users write them (object_store's prefixed aliases); each is checked to be a key
# obstore accepts, so this list cannot drift into names nothing reads.
SECRET_ALIASES = {
    S3Store: ["aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_token",
              "aws_sse_customer_key_base64", "aws_container_authorization_token_file",
              "aws_web_identity_token_file"],
    AzureStore: ["azure_storage_account_key", "azure_storage_access_key", "azure_storage_master_key", "master_key",
                 "access_key", "azure_storage_client_secret", "azure_client_secret", "azure_storage_sas_key",
                 "azure_storage_sas_token", "sas_token", "azure_storage_token", "bearer_token",
                 "azure_fabric_session_token", "azure_storage_encryption_key", "azure_federated_token_file"],
    GCSStore: ["google_service_account_key", "google_service_account", "google_service_account_path",
               "service_account_path", "google_application_credentials", "google_bearer_token"],
}
NOT_SECRET_ALIASES = {
    S3Store: ["aws_region", "aws_endpoint", "aws_endpoint_url", "aws_default_region", "aws_sse_kms_key_id",
              "aws_role_session_name", "aws_container_credentials_relative_uri", "aws_metadata_endpoint"],
    AzureStore: ["azure_storage_client_id", "azure_storage_tenant_id", "azure_authority_host",
                 "azure_fabric_token_service_url", "azure_msi_endpoint"],
    GCSStore: ["google_base_url"],
}


def _config_keys() -> dict[str, list[str]]:
    """Every field of every TypedDict in obstore's store stubs (S3, Azure, GCS, client options)."""
    out: dict[str, list[str]] = {}
    for stub in sorted(STUBS.glob("*.pyi")):
        for node in ast.parse(stub.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "TypedDict" for b in node.bases):
                out[node.name] = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign)]
    return out


def _known_to_obstore(store: type, key: str) -> bool:
    """Whether obstore takes `key` as a configuration key (any other complaint is about the dummy value)."""
    try:
        if store is AzureStore:
            store("container", config={"account_name": "acct", key: "x"})
        else:
            store("bucket", config={key: "x"})
    except obx.UnknownConfigurationKeyError:
        return False
    except Exception:  # a bad value for a known key
        return True
    return True


def test_every_obstore_config_key_is_classified():
    keys = _config_keys()
    assert {"S3Config", "AzureConfig", "GCSConfig", "ClientConfig"} <= set(keys), "obstore's stubs moved"
    assert set(keys) <= set(SECRET), f"classify the keys of {sorted(set(keys) - set(SECRET))}"
    wrong = [(cls, k, is_secret_option(k)) for cls, names in keys.items() for k in names
             if is_secret_option(k) != (k in SECRET[cls])]
    assert wrong == [], "(class, key, is_secret_option) that disagree with the classification"
    assert "sse_customer_key_base64" in keys["S3Config"]


@pytest.mark.parametrize("store", list(SECRET_ALIASES))
def test_the_aliases_lance_users_write(store):
    for key in SECRET_ALIASES[store] + NOT_SECRET_ALIASES[store]:
        assert _known_to_obstore(store, key), f"{key} is not an obstore key"
    assert [k for k in SECRET_ALIASES[store] if not is_secret_option(k)] == []
    assert [k for k in NOT_SECRET_ALIASES[store] if is_secret_option(k)] == []
    assert is_secret_option("AWS_SECRET_ACCESS_KEY") and not is_secret_option("AWS_REGION"), "case does not matter"


# Spark / Hadoop confs: (key, secret?)
SPARK_CONFS = [
    ("spark.hadoop.fs.s3a.secret.key", True),
    ("spark.hadoop.fs.s3a.access.key", True),
    ("spark.hadoop.fs.s3a.session.token", True),
    ("spark.hadoop.fs.s3a.bucket.lake.secret.key", True),
    ("spark.hadoop.fs.s3a.encryption.key", True),
    ("spark.hadoop.fs.s3a.server-side-encryption.key", True),
    ("spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", True),
    ("spark.hadoop.fs.azure.account.oauth2.client.secret", True),
    ("spark.hadoop.fs.azure.sas.container.acct.blob.core.windows.net", True),
    ("spark.hadoop.fs.gs.auth.service.account.private.key", True),
    ("spark.ssl.keyPassword", True),
    ("spark.ssl.trustStorePassword", True),
    ("spark.authenticate.secret", True),
    ("spark.kubernetes.authenticate.submission.oauthToken", True),
    ("spark.hadoop.javax.jdo.option.ConnectionPassword", True),
    ("spark.pyspark.python", False),
    ("spark.executor.memory", False),
    ("spark.driver.extraJavaOptions", False),
    ("spark.sql.session.timeZone", False),
    ("spark.hadoop.fs.s3a.endpoint", False),
    ("spark.hadoop.fs.s3a.path.style.access", False),
    ("spark.hadoop.fs.s3a.aws.credentials.provider", False),
    ("spark.hadoop.fs.s3a.encryption.algorithm", False),
    ("spark.security.credentials.hive.enabled", False),
    ("spark.kubernetes.authenticate.driver.serviceAccountName", False),
]


def test_redact_hides_secret_spark_confs_and_keeps_the_others_readable():
    cmd = ["spark-submit", "--master", "local[*]"]
    for key, _ in SPARK_CONFS:
        cmd += ["--conf", f"{key}=value-of-{key}"]
    cmd += ["job.py", "s3://b/t", "--storage-option", "aws_sse_customer_key_base64=c3NlYw==",
            "--storage-option", "aws_region=eu-west-1"]
    shown = redact(cmd)
    assert len(shown) == len(cmd)
    for key, secret in SPARK_CONFS:
        assert (f"{key}=***" if secret else f"{key}=value-of-{key}") in shown, key
    assert "aws_sse_customer_key_base64=***" in shown and "aws_region=eu-west-1" in shown
    assert redact(["x", "--storage-options-json", '{"aws_secret_access_key": "s"}']) == \
        ["x", "--storage-options-json", "***"]
    assert redact(["--storage-options-json", "@/run/so.json"]) == ["--storage-options-json", "@/run/so.json"]


# -- secrets never on spark-submit's command line: the tables file's spark_conf and `memwal --conf` --------

SECRET_CONFS = [key for key, secret in SPARK_CONFS if secret]
PLAIN_CONFS = [key for key, secret in SPARK_CONFS if not secret]
PROXY = "http://bob:pr0xy-pa55@proxy.internal:3128"


@pytest.mark.parametrize("key", SECRET_CONFS)
def test_the_tables_file_refuses_a_secret_spark_conf_naming_the_table_and_key(key):
    from memwal.airflow.config import parse_tables

    good, bad = parse_tables({"tables": {"t": {"uri": "/t", "spark_conf": {key: "s3cr3t-value"}}}}, "tables.yaml")
    message = str(bad["t"])
    assert not good and bad["t"].key == "spark_conf", message
    assert f"table 't', key 'spark_conf': {key!r} holds a secret" in message and "connection" in message
    assert "s3cr3t-value" not in message and "\n" not in message


def test_the_tables_file_keeps_plain_spark_confs_and_refuses_a_url_with_credentials():
    from memwal.airflow.config import parse_tables

    conf = {key: "1" for key in PLAIN_CONFS}
    user_only = {"spark.jars.repositories": "https://maven@repo.internal/maven2,s3://bucket/a@b"}
    good, bad = parse_tables({"tables": {"ok": {"uri": "/t", "spark_conf": {**conf, **user_only}},
                                         "proxy": {"uri": "/t", "spark_conf": {"spark.driver.extraJavaOptions":
                                                                               f"-Xmx1g -Dhttp.proxy={PROXY}"}},
                                         "url": {"uri": "/t", "spark_conf": {"spark.hadoop.fs.s3a.endpoint": PROXY}}}},
                             "tables.yaml")
    assert good["ok"].spark_conf == {**conf, **user_only}, "a user name alone is no secret"
    assert "'spark.hadoop.fs.s3a.endpoint' holds a secret" in str(bad["url"]) and "pr0xy" not in str(bad["url"])
    assert "'spark.driver.extraJavaOptions' holds a secret" in str(bad["proxy"]), "a URL inside a value too"


@pytest.mark.parametrize("conf", [*(f"{key}=s3cr3t-value" for key in SECRET_CONFS),
                                  f"spark.hadoop.fs.s3a.proxy.url={PROXY}"])
def test_memwal_conf_refuses_a_secret_with_exit_2_naming_the_key_only(conf, capfd):
    from memwal.cli import main

    key = conf.partition("=")[0]
    assert main(["merge", "/nonexistent/t.lance", "--spark", "--conf", conf]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"memwal merge: error: argument --conf: {key} holds a secret"), err
    assert "s3cr3t-value" not in err and "pr0xy" not in err and "--storage-options-json @FILE" in err


def test_memwal_conf_keeps_plain_spark_confs():
    from memwal.cli import _parse

    args = _parse(["merge", "/t", "--spark", *(x for key in PLAIN_CONFS for x in ("--conf", f"{key}=v"))])
    assert dict(args.conf) == {key: "v" for key in PLAIN_CONFS}


# -- credentials in URL-valued options (proxy_url=scheme://user:pass@host) -------------------------------


def test_redact_hides_the_credentials_of_a_url_and_keeps_the_rest_readable():
    from memwal.storage import redact_options, redact_value, url_credentials

    cmd = ["spark-submit", "--master", "spark://admin:m4ster@spark:7077", "--conf", f"spark.x.proxy={PROXY}",
           "job.py", "s3://b/t", "--storage-option", f"proxy_url={PROXY}", "--storage-option",
           "aws_endpoint=http://minio:9000", "--storage-option", "proxy_url=http://u:p@ss:w0rd@proxy:8080/x?y=z"]
    shown = redact(cmd)
    assert shown[2] == "spark://***@spark:7077" and shown[4] == "spark.x.proxy=http://***@proxy.internal:3128"
    assert f"proxy_url={PROXY}".replace("bob:pr0xy-pa55", "***") in shown
    assert "aws_endpoint=http://minio:9000" in shown and "s3://b/t" in shown
    assert shown[-1] == "proxy_url=http://***@proxy:8080/x?y=z", "the last @ before the host ends the userinfo"
    assert not any(s in " ".join(shown) for s in ("m4ster", "pr0xy", "w0rd"))
    assert redact_options({"proxy_url": PROXY, "aws_secret_access_key": "k", "aws_region": "eu-west-1"}) == {
        "proxy_url": "http://***@proxy.internal:3128", "aws_secret_access_key": "***", "aws_region": "eu-west-1"}
    assert redact_value("aws_endpoint", "https://s3.amazonaws.com/a@b") == "https://s3.amazonaws.com/a@b"
    assert url_credentials(PROXY) == "bob:pr0xy-pa55" and url_credentials("/data/a@b") is None
    assert url_credentials("s3://bucket/a:b@c") is None and url_credentials("https://git@host/x") is None
    assert redact_value("spark.driver.extraJavaOptions", f"-Xmx1g -Dhttp.proxy={PROXY} -Dx=ftp://a:b@f/") == \
        "-Xmx1g -Dhttp.proxy=http://***@proxy.internal:3128 -Dx=ftp://***@f/", "every URL in a value"


def test_the_hook_masks_the_credentials_of_a_url_valued_option(monkeypatch):
    """Airflow's masker gets the userinfo of a proxy_url from the connection, so task logs hide it."""
    from types import SimpleNamespace

    import airflow.sdk.log

    from memwal.airflow.hooks.memwal import MemWalHook

    masked = []
    monkeypatch.setattr(airflow.sdk.log, "mask_secret", lambda value, name=None: masked.append(value))
    conn = SimpleNamespace(conn_id="c", host=None, port=None, login="AKIA", password="s3cr3t",
                           extra_dejson={"storage_options": {"proxy_url": PROXY, "aws_region": "x"}})
    assert MemWalHook.storage_options_from(conn)["proxy_url"] == PROXY
    assert sorted(masked) == ["AKIA", "bob:pr0xy-pa55", "s3cr3t"]
