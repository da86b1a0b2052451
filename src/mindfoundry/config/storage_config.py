"""The `storage` section: how URLs (``s3://bucket/prefix``) in the config are reached.

Nothing here is needed for AWS itself, Huawei OBS, MinIO or any S3-compatible store when the standard AWS variables
and files are set (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``,
``AWS_PROFILE``, ``~/.aws/config``): the S3 client reads them itself. The section names what those cannot say, or
says it per run. Credentials belong in those variables and files; a secret written into ``options`` is used, but
never written out (``config show``, a run's config.yaml) -- :data:`REDACTED` stands in its place.
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from mindfoundry.config.section import Section

#: What a secret option is written as wherever a config is written out; read back, it is left out (so the
#: environment's credentials apply).
REDACTED = "<redacted>"

#: Option names whose values are secrets (s3fs key/secret/token, other file systems' passwords and tokens).
_SECRET_NAME = re.compile(r"(secret|token|password|passwd|credential|private|^key$|access_key)", re.IGNORECASE)


def is_secret_option(name: str) -> bool:
    """Whether an option of that name holds a secret (and is never written out)."""
    return bool(_SECRET_NAME.search(name))


def redacted(options: Any) -> Any:
    """``options`` (nested dicts) with every secret value replaced by :data:`REDACTED`."""
    if isinstance(options, dict):
        return {k: REDACTED if is_secret_option(str(k)) and v is not None else redacted(v) for k, v in options.items()}
    if isinstance(options, list):
        return [redacted(v) for v in options]
    return options


#: The AWS variables that hold a secret (their values are masked wherever text might quote them).
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def masked(text: str, secrets: list[str]) -> str:
    """``text`` with every secret of ``secrets`` and of the AWS variables (:data:`SECRET_VARIABLES`) replaced by
    :data:`REDACTED` (values under 4 characters are not secrets anyone could recognise, and masking them would
    mangle the text)."""
    known = secrets + [os.environ[name] for name in SECRET_VARIABLES if os.environ.get(name)]
    for secret in sorted(known, key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def public_command(argv: list[str]) -> str:
    """A command line as it may be written down (a lock file's holder) or printed: every ``--set`` of the ``storage``
    section's options (``storage.options.s3.secret=...``, ``storage={options: ...}``) with its value redacted, and
    the AWS variables' secrets masked."""
    shown = []
    for arg in argv:
        flag = "--set=" if arg.startswith("--set=") else ""
        key, eq, _ = arg[len(flag):].partition("=")
        if eq and key.strip().split(".")[:2] in (["storage"], ["storage", "options"]):
            arg = f"{flag}{key}={REDACTED}"
        shown.append(arg)
    return masked(" ".join(shown), [])


def without_redacted(options: Any) -> Any:
    """``options`` without the entries a written-out config replaced by :data:`REDACTED`."""
    if isinstance(options, dict):
        return {k: without_redacted(v) for k, v in options.items() if v != REDACTED}
    return options


class StorageConfig(Section):
    """How ``s3://`` (and other fsspec) URLs in the config are reached: endpoint, region, profile, retries, timeouts and
    per-protocol options. Every field is optional; credentials come from the AWS variables and files."""

    endpoint_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+(/\S*)?$",
        description="S3-compatible endpoint (Huawei OBS: https://obs.REGION.myhuaweicloud.com; MinIO: "
        "http://HOST:9000); null = AWS_ENDPOINT_URL, else AWS.",
    )
    region: str | None = Field(None, min_length=1, description="Region of the bucket; null = AWS_DEFAULT_REGION / "
                               "the profile's.")
    profile: str | None = Field(None, min_length=1, description="Profile of ~/.aws/config and ~/.aws/credentials; "
                                "null = AWS_PROFILE, else the default.")
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto", description="S3 addressing: path (MinIO, most on-premises stores), virtual (OBS), auto (AWS's rule)."
    )
    retries: int = Field(
        5, ge=0, le=50,
        description="Retries of a failed request (connection reset, timeout, throttling), with exponential backoff, "
        "before the command stops with one line naming the URL.",
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=600, description="Seconds to wait for a connection.")
    read_timeout_s: float = Field(60.0, gt=0, le=3600, description="Seconds to wait for a response.")
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per protocol, options handed to its fsspec file system as they are (s3: s3fs.S3FileSystem's, "
        "e.g. {s3: {requester_pays: true}}); secret values are never written out.",
    )

    @field_validator("options")
    @classmethod
    def _protocols(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for protocol in v:
            if not re.fullmatch(r"[a-z][a-z0-9+.-]*", protocol):
                raise ValueError(f"{protocol!r} is not a protocol name: key the options by protocol, e.g. "
                                 "{s3: {requester_pays: true}}")
        return v

    def fsspec_options(self, protocol: str) -> dict[str, Any]:
        """The keyword arguments of ``protocol``'s fsspec file system (the one place that derives them)."""
        own = without_redacted(self.options.get(protocol, {}))
        if protocol not in ("s3", "s3a"):
            return dict(own)
        client: dict[str, Any] = {}
        if self.region is not None:
            client["region_name"] = self.region
        config: dict[str, Any] = {
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.read_timeout_s,
            "retries": {"max_attempts": self.retries + 1, "mode": "standard"},
        }
        if self.addressing_style != "auto":
            config["s3"] = {"addressing_style": self.addressing_style}
        # botocore retries every request (connection errors, throttling, 5xx) with backoff (s3fs's own loop on top:
        # :attr:`outer_attempts`)
        options: dict[str, Any] = {"client_kwargs": client, "config_kwargs": config}
        if self.endpoint_url is not None:
            options["endpoint_url"] = self.endpoint_url
        if self.profile is not None:
            options["profile"] = self.profile
        for key, value in own.items():  # the user's options win; their client/config kwargs merge into ours
            if key in ("client_kwargs", "config_kwargs") and isinstance(value, dict):
                options[key] = {**options[key], **value}
            else:
                options[key] = value
        return options

    @property
    def outer_attempts(self) -> int:
        """Attempts of s3fs's own retry loop around botocore's (it also covers a body cut while it is read): one more
        than none, since the two layers of retries multiply."""
        return 2 if self.retries else 1

    def secrets(self) -> list[str]:
        """The secret values written in ``options`` (masked in any message that might quote them)."""
        found: list[str] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                for k, v in node.items():
                    if is_secret_option(str(k)) and isinstance(v, str) and v and v != REDACTED:
                        found.append(v)
                    else:
                        walk(v)

        walk(self.options)
        return found
