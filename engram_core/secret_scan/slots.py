"""What fills a credential's slot: a credential, or a stand-in that holds no secret (SPEC §13).

A slot rule (``password: …``, ``"api_key": "…"``, ``curl -u user:…``, a DSN's password; see
``secret_rules``) finds where a credential would be; what is there may hold none:

* a **placeholder**: a mask (``********``, ``xxxxxxxx``), a redaction marker (``<redacted>``,
  ``[REDACTED]``), a template or environment reference (``${DB_PASSWORD}``, ``$TOKEN``,
  ``{{ .Values.token }}``, ``%(password)s``), a YAML tag (``!vault``), a reference to where
  the secret is kept (``env:NAME``, ``vault:…``, ``op://…``, an ARN, a file path such as
  ``/etc/engram/host.key`` or ``engram-data/host.key``, an environment variable's name such
  as ``ENGRAM_MCP_TOKENS``), or a word documentation uses for one (``changeme``,
  ``your_api_key_here``);
* **code**, when the value is not quoted: ``password = settings.DB_PASSWORD`` (an attribute
  path); for ``.env``-style names also ``credential_ref=credential_ref`` (a snake_case
  name); for API keys and tokens also ``signing_key: Ed25519PrivateKey`` (a type) and
  ``accessToken: AccessTokenProvider``. Passwords are exempt from names and types: a bare
  ``password: Summer2024`` reads like a class name and is a password.

Refusing those would refuse memories about configuration and code that carry no secret, so
the scanner does not count them. Anything else is a credential: a value that merely looks
weak (``hunter2``, ``postgres``) is still one. The tests run on the value's bytes as the
rules see them (``secrets_scan.normalize``: ASCII, any other character one byte 0x80), with
RE2 or bytes methods only: linear in the value.
"""

from __future__ import annotations

import re2

# Which code shapes an unquoted value may take without counting (a rule's ``Slot.code``).
CODE_NONE = ""
CODE_PATHS = "paths"  # attribute paths: settings.DB_PASSWORD, self.password
CODE_NAMES = "names"  # also snake_case names: signing_key, credential_ref
CODE_IDENTIFIERS = "identifiers"  # also camelCase names and types: signingKey, Ed25519PrivateKey

# A value made only of these is a mask: "********", "xxxxxxxx", "........", "####".
_MASK = frozenset(b"*xX.#-_?")
# A value that starts with one of these is a template, reference or redaction marker:
# ${VAR} $VAR $(cmd) %(name)s %VAR% <redacted> {{ var }} [REDACTED].
_TEMPLATE_START = frozenset(b"$%<{[")
# A reference to where the secret is kept, not the secret (lower case).
_REFERENCE_PREFIXES = (b"env:", b"vault:", b"file:", b"op://", b"arn:", b"secretref:", b"ref+")
_PATH_PREFIXES = (b"/", b"~/", b"./", b"../")
# Words documentation and templates put in a credential's place, compared in lower case
# with "_", "-", "." and spaces removed.
_WORDS = frozenset(
    b"changeme changeit password passwd pass pwd secret token apikey redacted removed hidden masked "
    b"placeholder example sample dummy none null nil undefined true false empty notset unset "
    b"required optional string value todo tbd fixme".split()
)
# Wording of a stand-in, letters only: "your_api_key_here", "enter-password", "insert_key_here"
# (but "yourname2024" is a credential).
_WORD_PREFIXES = (b"your", b"enter", b"insert")
_WORD_SUFFIXES = (b"here",)
_WORD_DROPPED = b"_-. "


def _re(pattern: bytes) -> re2._Regexp:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    return re2.compile(pattern, options)


# A relative file path: segments of path characters with a file extension at the end
# (base64 has no "."; a token with "/" and "." is rare, a path with both is the norm).
_RELATIVE_PATH = _re(rb"[A-Za-z0-9_.~-]+(?:/[A-Za-z0-9_.~-]+)*/[A-Za-z0-9_~-][A-Za-z0-9_.~-]*\.[A-Za-z]{1,5}")
_ENVIRONMENT_NAME = _re(rb"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_ATTRIBUTE_PATH = _re(rb"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_SNAKE_NAME = _re(rb"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
# Names and types as code spells them: lowerCamel (or one lower-case word) and UpperCamel with
# digit runs (Ed25519PrivateKey), every word pronounceable: a vowel after at most three
# consonants. Random letters and digits seldom parse so: of 100,000 random tokens of 16
# characters 17 do, of 24 at most 1, of 32 none (tests/unit/test_secret_slots.py); a bare
# slot of an API key or token needs 16 characters to count at all.
_CONSONANTS = rb"[b-df-hj-np-tv-z]{0,3}"
_WORD = rb"(?:[AEIOU][a-z]+|[A-Z]" + _CONSONANTS + rb"[aeiou][a-z]*)"
_CAMEL_NAME = _re(
    _CONSONANTS + rb"[aeiou][a-z]*(?:" + _WORD + rb"|[0-9]+)*"
    rb"|(?:" + _WORD + rb"|[0-9]+)+"
)


# Each pattern above costs a call into RE2 (microseconds), so it runs only when a byte test
# says it could match: a slot is judged per match, SLOT_BUDGET times per rule at most.


def is_placeholder(value: bytes) -> bool:
    """Whether a slot's value is a stand-in that holds no secret, quoted or not."""
    v = value.strip()
    if not v or all(b in _MASK for b in v):
        return True
    if v[0] in _TEMPLATE_START:
        return True
    if v[0] == ord("!") and v[1:].isalpha():
        return True  # a YAML tag: "password: !vault |" keeps the ciphertext on the next lines
    lowered = v.lower()
    if lowered.startswith(_REFERENCE_PREFIXES) or v.startswith(_PATH_PREFIXES):
        return True
    if b"/" in v and b"." in v and _RELATIVE_PATH.fullmatch(v):
        return True  # signing_key = "engram-data/host.key"
    if b"_" in v and v.isupper() and _ENVIRONMENT_NAME.fullmatch(v):
        return True  # token_env = "ENGRAM_MCP_TOKENS"
    word = lowered.translate(None, _WORD_DROPPED)
    if word in _WORDS:
        return True
    return word.isalpha() and (word.startswith(_WORD_PREFIXES) or word.endswith(_WORD_SUFFIXES))


def is_code(value: bytes, code: str) -> bool:
    """Whether an unquoted value is code of the shapes ``code`` allows (CODE_*). A trailing
    "," or ";" is the code's, not the value's (``signing_key=signing_key,``)."""
    if code == CODE_NONE:
        return False
    value = value.rstrip(b",;")
    if b"." in value and _ATTRIBUTE_PATH.fullmatch(value):
        return True
    if code == CODE_PATHS:
        return False
    if b"_" in value and value.islower() and _SNAKE_NAME.fullmatch(value):
        return True
    return code == CODE_IDENTIFIERS and value.isalnum() and _CAMEL_NAME.fullmatch(value) is not None


def holds_no_secret(value: bytes, *, bare: bool, code: str) -> bool:
    """Whether a slot holds no credential: a placeholder, or (unquoted) code of the allowed shapes."""
    return is_placeholder(value) or (bare and is_code(value, code))
