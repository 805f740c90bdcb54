"""`[http.oauth]` of the host TOML: what is refused at load, with the message an operator reads
(adapters/mcp/oauth/settings.py). The start-up path itself (one line, exit 2) is
tests/oauth/test_oauth_keys_and_doctor.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.mcp.config import ConfigError, load_host_config
from adapters.mcp.oauth.settings import DEFAULT_ALGORITHMS

ISSUER = 'issuer = "https://idp.example.com/realms/acme"'


def _config(tmp_path: Path, oauth: str, *, before: str = "") -> Path:
    key = tmp_path / "host.key"
    if not key.exists():
        from engram_core.trust.hostkeys import load_or_create_private_key

        load_or_create_private_key(key)
    path = tmp_path / "host.toml"
    path.write_text(f'[core]\naddress = "127.0.0.1:1"\n\n[host]\nsigning_key = "{key}"\n\n{before}'
                    f"[http.oauth]\n{oauth}\n")
    return path


def test_defaults(tmp_path: Path) -> None:
    oauth = load_host_config(_config(tmp_path, ISSUER)).http.oauth
    assert oauth is not None and oauth.issuer == "https://idp.example.com/realms/acme"
    assert oauth.algorithms == DEFAULT_ALGORITHMS and "none" not in oauth.algorithms
    assert (oauth.clock_skew_s, oauth.jwks_max_age_s, oauth.jwks_refresh_cooldown_s) == (30, 300, 30)
    assert (oauth.introspection_cache_s, oauth.introspection_budget_per_s) == (30, 5)
    assert (oauth.fetch_deadline_s, oauth.check_deadline_s) == (5.0, 8.0)
    assert oauth.resource is None and oauth.introspection_client is None and oauth.policies is None


def test_relative_policies_resolve_beside_the_config_and_the_secret_comes_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_TEST_SECRET", "s3cr3t-value-for-introspection")
    oauth = load_host_config(_config(tmp_path, ISSUER + '\npolicies = "bundle"\nintrospection_client_id = "rs"\n'
                                     'introspection_secret_env = "ENGRAM_TEST_SECRET"')).http.oauth
    assert oauth is not None and oauth.policies == tmp_path / "bundle"
    assert oauth.introspection_client is not None and oauth.introspection_client.secret == "s3cr3t-value-for-introspection"
    assert "s3cr3t" not in repr(oauth)


def test_the_issuer_deadlines_are_configurable(tmp_path: Path) -> None:
    """Whole seconds or fractions; equal deadlines are allowed (a check waits out at most one fetch).
    That the assembled adapter keeps to them: tests/oauth/test_oauth_hostile_issuer.py."""
    oauth = load_host_config(_config(tmp_path, ISSUER + "\nfetch_deadline_s = 1\ncheck_deadline_s = 1.5")).http.oauth
    assert oauth is not None and (oauth.fetch_deadline_s, oauth.check_deadline_s) == (1.0, 1.5)
    oauth = load_host_config(_config(tmp_path, ISSUER + "\nfetch_deadline_s = 8")).http.oauth
    assert oauth is not None and (oauth.fetch_deadline_s, oauth.check_deadline_s) == (8.0, 8.0)


@pytest.mark.parametrize(("oauth", "message"), [
    ('issuer = "http://idp.example.com"', "must use https://"),
    ('issuer = "ftp://idp.example.com"', "absolute https:// URL"),
    ('issuer = "https://idp.example.com#x"', "without a fragment"),
    ("", "missing issuer"),
    (ISSUER + '\nalgorithms = ["HS256"]', "refused: HS256"),
    (ISSUER + '\nalgorithms = ["RS256", "none"]', "refused: none"),
    (ISSUER + "\nalgorithms = []", "non-empty list"),
    (ISSUER + "\nclock_skew_s = 3600", "clock_skew_s"),
    (ISSUER + "\nclock_skew_s = true", "clock_skew_s"),
    (ISSUER + "\nintrospection_budget_per_s = 0", "introspection_budget_per_s"),
    (ISSUER + "\nfetch_deadline_s = 0", "fetch_deadline_s in [http.oauth] must be a number of seconds above 0"),
    (ISSUER + "\ncheck_deadline_s = -1.5", "check_deadline_s in [http.oauth] must be a number of seconds above 0"),
    (ISSUER + "\ncheck_deadline_s = 61", "at most 60"),
    (ISSUER + '\nfetch_deadline_s = "5"', "fetch_deadline_s in [http.oauth] must be a number of seconds"),
    (ISSUER + "\nfetch_deadline_s = true", "fetch_deadline_s in [http.oauth] must be a number of seconds"),
    (ISSUER + "\nfetch_deadline_s = nan", "fetch_deadline_s in [http.oauth] must be a number of seconds"),
    (ISSUER + "\nfetch_deadline_s = 9", "check_deadline_s (8 s) in [http.oauth] must be at least fetch_deadline_s (9 s)"),
    (ISSUER + "\nfetch_deadline_s = 2\ncheck_deadline_s = 1.5", "must be at least fetch_deadline_s (2 s)"),
    (ISSUER + '\nintrospection_client_id = "x"', "go together"),
    (ISSUER + '\nintrospection_endpoint = "https://idp.example.com/introspect"', "needs introspection_client_id"),
    (ISSUER + '\nintrospection_client_id = "x"\nintrospection_secret_env = "ENGRAM_TEST_NO_SUCH_SECRET"',
     "ENGRAM_TEST_NO_SUCH_SECRET"),
    (ISSUER + '\njwks_uri = "http://keys.example.com/jwks"', "must use https://"),
    (ISSUER + '\npolicies = "a"\nopa_url = "http://127.0.0.1:8181"', "either policies or opa_url"),
    (ISSUER + "\nbogus = 1", "unknown keys in [http.oauth]: bogus"),
])
def test_an_unusable_oauth_section_is_refused_at_load(tmp_path: Path, oauth: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        load_host_config(_config(tmp_path, oauth))
    assert message in str(err.value)


def test_oauth_excludes_static_tokens_and_a_binding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_TEST_TOKENS", "a-static-token-of-enough-length")
    with pytest.raises(ConfigError) as err:
        load_host_config(_config(tmp_path, ISSUER, before='[http]\ntoken_env = "ENGRAM_TEST_TOKENS"\n'))
    assert "exclude each other" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_host_config(_config(tmp_path, ISSUER, before='[binding]\ntenant = "t"\nworkspace = "w"\nprincipal = "p"\n\n'))
    assert "remove [binding]" in str(err.value)


def test_a_token_file_others_can_read_is_refused_by_http_only(tmp_path: Path) -> None:
    token = tmp_path / "host.token"
    token.write_text("a-token-that-is-long-enough\n")
    token.chmod(0o644)
    key = tmp_path / "host.key"
    from engram_core.trust.hostkeys import load_or_create_private_key

    load_or_create_private_key(key)
    path = tmp_path / "host.toml"
    path.write_text(f'[core]\naddress = "127.0.0.1:1"\n[host]\nsigning_key = "{key}"\n'
                    '[binding]\ntenant = "t"\nworkspace = "w"\nprincipal = "p"\n[http]\ntoken_file = "host.token"\n')
    http = load_host_config(path).http  # stdio still loads the file
    assert http.token_file_problem is not None and "chmod 600" in http.token_file_problem
    assert not http.token_digests
    token.chmod(0o600)
    http = load_host_config(path).http
    assert http.token_file_problem is None and len(http.token_digests) == 1
