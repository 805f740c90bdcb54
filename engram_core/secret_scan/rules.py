"""The secret scanner's rules: credential shapes in RE2 syntax (SPEC §13).

Most rules are derived from gitleaks' rule set (https://github.com/gitleaks/gitleaks,
``cmd/generate/config/rules/*.go``; rule ids kept where a rule was taken over) and from
detect-secrets' plugins (https://github.com/Yelp/detect-secrets, Apache-2.0) for the Discord
bot token and Twilio shapes. They were translated to what RE2 accepts (no lookarounds, no
backreferences) and adapted: a leading word boundary is dropped wherever the prefix alone
is distinctive, so a token glued to a preceding word is still found. The licence notices:

    gitleaks — MIT License. Copyright (c) 2019 Zachary Rice.
    Permission is hereby granted, free of charge, to any person obtaining a copy of this
    software and associated documentation files (the "Software"), to deal in the Software
    without restriction, including without limitation the rights to use, copy, modify,
    merge, publish, distribute, sublicense, and/or sell copies of the Software, and to
    permit persons to whom the Software is furnished to do so, subject to the following
    conditions: The above copyright notice and this permission notice shall be included in
    all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED "AS IS",
    WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE
    WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.

    detect-secrets — Apache License 2.0. Copyright (c) 2018 Yelp, Inc.

A rule is ``(rule id, kind, keywords, pattern, slot)``. ``kind`` is the credential class
the capture policy sees; ``rule`` says which shape matched (a policy author can single one
out). ``keywords`` (lowercase) gate the rule as in gitleaks: it runs only when one of them
occurs in the lower-cased text; an empty tuple means it always runs. Every pattern is
compiled by RE2, which matches in time linear in the input: no rule can backtrack.

``slot`` is set on the rules that find a credential by its *slot* (a name and an assignment,
``curl -u user:…``, a DSN's password) rather than by its own shape: the same pattern with
capturing groups around the slot's content (one participates per match). A match whose
content holds no secret (``secret_slots``: a placeholder such as ``********``,
``${DB_PASSWORD}``, ``<redacted>``, ``changeme``; or, unquoted, code such as
``settings.DB_PASSWORD``) is not counted.
"""

from __future__ import annotations

from typing import NamedTuple

from engram_core.secret_scan.slots import CODE_IDENTIFIERS, CODE_NAMES, CODE_NONE, CODE_PATHS


class Slot(NamedTuple):
    """How a slot rule's match is judged (``secret_slots.holds_no_secret``)."""

    pattern: str  # the rule's pattern with capturing groups around the content; one participates
    bare_group: int = 0  # the (1-based) group that holds an unquoted value; 0 when none does
    code: str = CODE_NONE  # which code shapes an unquoted value may take without counting


class Rule(NamedTuple):
    rule: str
    kind: str
    keywords: tuple[str, ...]
    pattern: str
    slot: Slot | None = None  # None: the shape alone counts


def _slot(rule: str, kind: str, keywords: tuple[str, ...], parts: tuple[str, ...], *,
          bare_group: int = 0, code: str = CODE_NONE) -> Rule:
    """A rule that finds a credential by its slot: ``parts`` alternate between the pattern
    around the content and the content itself (odd positions), so that the counted pattern
    and the one that extracts the content are built from the same text."""
    pattern = "".join(p if i % 2 == 0 else f"(?:{p})" for i, p in enumerate(parts))
    with_groups = "".join(p if i % 2 == 0 else f"({p})" for i, p in enumerate(parts))
    return Rule(rule, kind, keywords, pattern, Slot(with_groups, bare_group, code))


# Counted repetitions are kept short or open-ended ({n,}): a bounded count that many
# positions of a long run can start (``[a-z]{1,20}``) multiplies the automaton's states.
# Keyword-led assignments (``name = value``) share the separator gitleaks uses.
_ASSIGN = r"""[ \t'"]{0,3}(?:=|:=|=>|:|\|\|)[ \t'"`]{0,5}"""
# Where an unquoted value ends: a space, a quote, a separator, a closing parenthesis (a
# credential in parentheses), the end. Not "(": ``getpass()`` is a call.
_VALUE_END = r"""(?:[\s'";,#)]|$)"""

# -- credentials named by a key, in any structured text ------------------------------------
# ``password: …`` (YAML), ``"password": "…"`` (JSON), ``{'password': '…'}`` (a Python dict),
# ``password = "…"`` (TOML, INI), ``:password => "…"`` (Ruby), ``config["password"] = "…"``,
# ``--password=…``. The key may be quoted and may carry a prefix (``db_password``,
# ``dbPassword``, ``mysql.password``): the name must end the key, so ``password_policy: …``
# is not a slot. Boundaries are zero-width (``\b``): a class before the key would consume the
# character that ended the previous match, and the second of ``pass=a pass=b`` would be missed.
_KEY_END = r"""['"]?\]?[ \t]*(?:=>|:=|=|:)[ \t]*"""
_PASSWORD_NAME = r"(?:password|passwd|passphrase|(?:\b|_)(?:pass|pwd))"
_SECRET_NAME = (
    r"(?:(?:api|secret|private|access|signing|encryption|master|client|app|account|auth)[_.-]?key"
    r"|secret"
    r"|(?:access|refresh|auth|api|bearer|session|id|oauth|client|bot|app|private|secret|personal[_.-]?access)"
    r"[_.-]?token"
    r"|(?:\b|_)token)"
)


_NAMED_BARE = 3  # _named_value's groups: double-quoted, single-quoted, bare


def _named_value(key: str, quoted: int, bare: int) -> tuple[str, ...]:
    """``_slot`` parts for a key then its value, of at least ``quoted`` or ``bare`` characters:
    double- or single-quoted (spaces allowed inside: a TOML or JSON passphrase), or bare up to
    where a value ends (so ``password = getpass()`` and ``token = issue_token(user)`` are
    code, not credentials)."""
    q, b = f"{{{quoted},}}", f"{{{bare},}}"
    return (key + r'(?:"', r'[^"\r\n]' + q, r""""|'""", r"[^'\r\n]" + q, r"'|", r"""[^\s'"()]""" + b,
            _VALUE_END + ")")


RULES: tuple[Rule, ...] = (
    # -- private keys ------------------------------------------------------------------------
    Rule("private-key", "private_key", ("-----begin",),
         r"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"),
    Rule("putty-private-key", "private_key", ("putty-user-key-file",),
         r"PuTTY-User-Key-File-[0-9]+: "),
    # SSH.com / RFC 4716-style armour: four dashes and spaces, not PEM's five.
    Rule("ssh2-private-key", "private_key", ("begin ssh2",),
         r"-{4,5}[ \t]*BEGIN SSH2 (?:ENCRYPTED )?PRIVATE KEY[ \t]*-{4,5}"),
    Rule("age-secret-key", "private_key", ("age-secret-key-1",),
         r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    # -- cloud providers ---------------------------------------------------------------------
    Rule("aws-access-token", "aws_access_key", ("akia", "asia", "abia", "acca", "a3t"),
         # ACCA is all hex digits: it must not continue a hex run (an upper-case SHA is no key).
         r"(?:(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA)|(?:^|[^0-9A-F])ACCA)[A-Z0-9]{16}"),
    Rule("aws-secret-access-key-assignment", "aws_secret_key", ("aws",),
         r"(?i)aws.{0,20}(?:secret|key).{0,5}[:=][ \t]*['\"]?[A-Za-z0-9/+=]{40}"),
    # aws-secret-access-key (a bare 40-character key with nothing naming it) is not a
    # pattern: see secrets_scan._bare_aws_secret_keys.
    Rule("gcp-api-key", "google_api_key", ("aiza",), r"AIza[0-9A-Za-z_-]{35}"),
    Rule("gcp-oauth-client-secret", "google_oauth_secret", ("gocspx-",), r"GOCSPX-[A-Za-z0-9_-]{28}"),
    Rule("gcp-oauth-access-token", "google_oauth_secret", ("ya29.",), r"ya29\.[0-9A-Za-z_-]{20,}"),
    Rule("gcp-oauth-refresh-token", "google_oauth_secret", ("1//0",), r"1//0[0-9A-Za-z_-]{40,}"),
    Rule("azure-storage-key", "azure_key", ("accountkey", "sharedaccesskey", "sharedaccesssignature"),
         r"(?i)(?:AccountKey|SharedAccessKey|SharedAccessSignature)[ \t]*=[ \t]*[A-Za-z0-9+/%=]{20,}"),
    Rule("azure-ad-client-secret", "azure_key", ("q~",),
         r"[a-zA-Z0-9_~.]{3}[0-9]Q~[a-zA-Z0-9_~.-]{31,34}"),
    Rule("digitalocean-token", "digitalocean_token", ("do_v1_", "dop_v1_", "dor_v1_", "doo_v1_"),
         r"do[opr]?_v1_[a-f0-9]{64}"),
    Rule("hashicorp-vault-token", "vault_token", ("hvs.", "hvb."), r"hv[sb]\.[A-Za-z0-9_-]{90,}"),
    Rule("databricks-api-token", "databricks_token", ("dapi",), r"dapi[a-f0-9]{32}"),
    Rule("flyio-access-token", "flyio_token", ("fo1_", "fm1", "fm2_"), r"(?:fo1_[A-Za-z0-9_-]{43}|fm[12][ar]?_[A-Za-z0-9+/]{100,}={0,3})"),
    Rule("dynatrace-api-token", "dynatrace_token", ("dt0c01.",), r"dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"),
    Rule("new-relic-user-api-key", "newrelic_key", ("nrak-",), r"NRAK-[A-Za-z0-9]{27}"),
    Rule("grafana-service-account-token", "grafana_token", ("glsa_",), r"glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    Rule("grafana-cloud-api-token", "grafana_token", ("glc_",), r"glc_[A-Za-z0-9+/]{32,}"),
    # -- source hosting and package registries ----------------------------------------------
    Rule("github-token", "github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
         r"gh[pousr]_[A-Za-z0-9]{30,}"),
    Rule("github-fine-grained-pat", "github_token", ("github_pat_",), r"github_pat_[A-Za-z0-9_]{40,}"),
    Rule("gitlab-token", "gitlab_token", ("glpat-", "glptt-", "gldt-", "glrt-", "glcbt-", "glft-", "glimt-"),
         r"gl(?:pat|ptt|dt|rt|cbt|ft|imt)-[A-Za-z0-9_-]{20,}"),
    Rule("npm-access-token", "npm_token", ("npm_",), r"npm_[A-Za-z0-9]{36}"),
    Rule("pypi-upload-token", "pypi_token", ("pypi-ageicHlwaS5vcmc".lower(),), r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
    Rule("rubygems-api-token", "rubygems_token", ("rubygems_",), r"rubygems_[a-f0-9]{48}"),
    Rule("huggingface-access-token", "huggingface_token", ("hf_",), r"hf_[A-Za-z0-9]{30,}"),
    Rule("atlassian-api-token", "atlassian_token", ("atatt3",), r"ATATT3[A-Za-z0-9_=-]{150,}"),
    Rule("postman-api-token", "postman_token", ("pmak-",), r"PMAK-[a-fA-F0-9]{24}-[a-fA-F0-9]{34}"),
    Rule("linear-api-key", "linear_key", ("lin_api_",), r"lin_api_[A-Za-z0-9]{40}"),
    Rule("doppler-api-token", "doppler_token", ("dp.pt.",), r"dp\.pt\.[A-Za-z0-9]{43}"),
    Rule("pulumi-api-token", "pulumi_token", ("pul-",), r"pul-[a-f0-9]{40}"),
    # -- messaging ---------------------------------------------------------------------------
    Rule("slack-token", "slack_token", ("xoxa-", "xoxb-", "xoxp-", "xoxo-", "xoxs-", "xoxr-", "xoxe"),
         r"xox(?:[abposr]|e(?:\.xox[bp])?)-[A-Za-z0-9-]{10,}"),
    Rule("slack-app-token", "slack_token", ("xapp-",), r"(?i)xapp-[0-9]-[A-Z0-9]+-[0-9]+-[a-z0-9]+"),
    Rule("slack-webhook-url", "slack_webhook", ("hooks.slack.com",),
         r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/]{43,56}"),
    # Needs a non-token character before it: allowing a glued start lets every M, N or O
    # inside a long run open a thread, and the automaton's states multiply (2^25).
    Rule("discord-bot-token", "discord_token", (),
         r"(?:^|[^A-Za-z0-9_-])[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}"),
    Rule("discord-webhook-url", "discord_token", ("discord",),
         r"(?i)discord(?:app)?\.com/api/webhooks/[0-9]{17,20}/[A-Za-z0-9_-]{60,68}"),
    Rule("discord-client-secret", "discord_token", ("discord",),
         r"(?i)discord[a-z0-9_.-]{0,20}" + _ASSIGN + r"[A-Za-z0-9_=-]{32,64}"),
    Rule("telegram-bot-api-token", "telegram_token", (":aa",), r"[0-9]{5,16}:AA[0-9A-Za-z_-]{33}"),
    Rule("twilio-api-key", "twilio_key", ("sk",), r"SK[0-9a-fA-F]{32}"),
    Rule("twilio-auth-token", "twilio_key", ("twilio",),
         r"(?i)twilio[a-z0-9_.-]{0,20}" + _ASSIGN + r"[0-9a-f]{32}"),
    Rule("sendgrid-api-token", "sendgrid_key", ("sg.",), r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"),
    Rule("mailchimp-api-key", "mailchimp_key", ("-us",), r"[0-9a-f]{32}-us[0-9]{1,2}"),
    # -- payments ----------------------------------------------------------------------------
    Rule("stripe-access-token", "stripe_key", ("sk_live_", "sk_test_", "rk_live_", "rk_test_"),
         r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),
    Rule("stripe-webhook-secret", "stripe_key", ("whsec_",), r"whsec_[A-Za-z0-9+/]{24,}"),
    Rule("square-access-token", "square_token", ("sq0atp-", "sq0csp-"),
         r"sq0(?:atp|csp)-[0-9A-Za-z_-]{22,43}"),
    Rule("shopify-token", "shopify_token", ("shpat_", "shpca_", "shppa_", "shpss_"),
         r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    # -- AI providers ------------------------------------------------------------------------
    Rule("anthropic-api-key", "anthropic_key", ("sk-ant-",), r"sk-ant-[a-z]{2,8}[0-9]{2}-[A-Za-z0-9_-]{20,}"),
    Rule("openai-api-key", "openai_key", ("sk-",),
         r"sk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,}|[A-Za-z0-9]{20,})"),
    Rule("groq-api-key", "groq_key", ("gsk_",), r"gsk_[A-Za-z0-9]{48,}"),
    # -- generic shapes ----------------------------------------------------------------------
    Rule("jwt", "jwt", ("eyj",), r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    _slot("connection-string", "connection_string", ("://",),
          (r"(?i)[a-z][a-z0-9+.-]*://[^\s:/@]*:", r"[^\s@/]{3,}", r"@[^\s/]")),
    # Go's MySQL driver: user:password@tcp(host:3306)/db, @unix(/path), or @/db (no address).
    _slot("mysql-go-dsn", "connection_string", ("@tcp(", "@tcp6(", "@unix(", "@udp(", "@/"),
          (r"[^\s:@/()'\"]*:", r"[^\s@'\"]{3,}", r"@(?:(?:tcp6?|unix|udp)\(|/)")),
    # curl -u user:password, --user, -U / --proxy-user, a cluster of flags ending in u (-su).
    # Lazy up to the flag: the first -u of a line is judged first, so a placeholder in a later
    # command on the same line cannot swallow a real one before it.
    _slot("curl-user-password", "basic_auth_credentials", ("curl",),
          (r"(?i)\bcurl\b[^\n]*?\s(?:-[a-z]*u|--user|--proxy-user)(?:[ \t]+|=)?['\"]?[^\s:'\"]*:",
           r"[^\s'\"]{3,}", "")),
    Rule("bearer-token", "bearer_token", ("bearer",), r"(?i)bearer[ \t]+[A-Za-z0-9._~+/-]{20,}"),
    Rule("basic-auth-header", "basic_auth_header", ("authorization",),
         r"(?i)authorization:[ \t]*basic[ \t]+[A-Za-z0-9+/]{12,}"),
    Rule("session-cookie", "session_cookie", ("cookie",),
         r"(?i)\b(?:set-)?cookie:[ \t]*[^\s=;]*(?:sess|sid|token|auth)[^\s=;]*=[A-Za-z0-9%._-]{12,}"),
    # Named slots (see _named_value: the value must end where a value ends).
    _slot("password-assignment", "password_assignment", ("pass", "pwd"),
          _named_value("(?i)" + _PASSWORD_NAME + _KEY_END, 6, 6), bare_group=_NAMED_BARE, code=CODE_PATHS),
    _slot("dotenv-secret", "dotenv_secret",
          ("secret", "token", "api_key", "apikey", "private_key", "access_key", "password", "passwd", "_pass",
           "_pwd", "credential"),
          (r"(?im)\b(?:export[ \t]+)?[A-Z0-9_]*(?:SECRET|TOKEN|API_KEY|APIKEY|PRIVATE_KEY|"
           r"ACCESS_KEY|PASSWORD|PASSWD|_PASS|_PWD|CREDENTIAL)S?(?:_[A-Z0-9_]*)?[ \t]*=[ \t]*['\"]?",
           r"[^\s'\"()]{8,}", _VALUE_END), bare_group=1, code=CODE_NAMES),
    # An unquoted API key or token needs 16 characters (as gitleaks' generic rule): shorter
    # bare values under these names are mostly names and types in code.
    _slot("generic-api-key", "generic_api_key", ("key", "secret", "token"),
          _named_value("(?i)" + _SECRET_NAME + _KEY_END, 8, 16), bare_group=_NAMED_BARE, code=CODE_IDENTIFIERS),
)
