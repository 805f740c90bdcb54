"""Secret scanner run over every text and citation field at capture (SPEC §13).

It reports kinds and counts only; the capture policy decides. Patterns favour
recall on credential shapes that have a recognisable structure; prose that
merely mentions "password" or "token" is not a finding.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")),
    ("aws_secret_key", re.compile(r"(?i)aws.{0,20}(?:secret|key).{0,5}[:=]\s*['\"]?[A-Za-z0-9/+=]{40}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})")),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("stripe_key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("openai_key", re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}")),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b")),
    ("huggingface_token", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("sendgrid_key", re.compile(r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}")),
    # Azure storage / service bus connection strings and SAS (no scheme://user:pass@ shape)
    ("azure_key", re.compile(r"(?i)\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)\s*=\s*[A-Za-z0-9+/%=]{20,}")),
    (
        "connection_string",
        re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,20}://[^\s:/@]*:[^\s@/]{3,}@[^\s/]+"),  # user may be empty
    ),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/-]{20,}=*")),
    ("basic_auth_header", re.compile(r"(?i)\bauthorization:\s*basic\s+[A-Za-z0-9+/]{12,}=*")),
    (
        "session_cookie",
        re.compile(r"(?i)\b(?:set-)?cookie:\s*[^\s=;]*(?:sess|sid|token|auth)[^\s=;]*=[A-Za-z0-9%._-]{12,}"),
    ),
    (
        "password_assignment",
        re.compile(r"(?i)\b(?:password|passwd|pwd|pass)\s*[:=]\s*['\"]?[^\s'\"]{6,}"),
    ),
    (
        "dotenv_secret",
        re.compile(
            r"(?im)(?:^|[\s;:,(])(?:export\s+)?[A-Z0-9_]*(?:SECRET|TOKEN|API_KEY|APIKEY|PRIVATE_KEY|ACCESS_KEY|PASSWORD|PASSWD|"
            r"_PASS|_PWD|CREDENTIALS?)[A-Z0-9_]*\s*=\s*['\"]?[^\s'\"]{8,}"
        ),
    ),
    (
        "generic_api_key",
        re.compile(r"(?i)\b(?:api[_-]?key|apikey|secret[_-]?key|access[_-]?token|client[_-]?secret)\s*[:=]\s*['\"]?[A-Za-z0-9_\-]{16,}"),
    ),
)


def scan(texts: Iterable[str]) -> list[dict[str, int | str]]:
    """Findings as ``[{"kind", "count"}]`` sorted by kind; never the matched text."""
    counts: Counter[str] = Counter()
    for text in texts:
        for kind, pattern in _PATTERNS:
            n = len(pattern.findall(text))
            if n:
                counts[kind] += n
    return [{"kind": k, "count": counts[k]} for k in sorted(counts)]
