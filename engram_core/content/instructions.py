"""The instruction detector: what in a memory addresses the agent that will later read it.

A memory records knowledge; a poisoned memory carries orders for its future reader (published
attacks: MINJA's query-only injection, AgentPoison's trigger phrases, a dormant payload planted
by one untrusted tool call, forged tags in session summaries). This module reports, per
catalogue code, how often a rule matched and in which component kinds. It never decides:
``policies/engram/admission`` does, with the tenant's settings.

**Linear time.** Every rule is an RE2 pattern (``google-re2``), as the secret scanner's: RE2
never backtracks, so a scan costs time linear in the text whatever it holds. One pass of an RE2
set of every rule says which rules match at all; only those run again for their matches. The
only other work per match is bounded (a look at the 60 characters before it for a negation, and a binary
search in the text's quoted spans).

**Hard negatives.** Engineering memories legitimately say "always run migrations under the
advisory lock" or "never log tokens", quote commands and URLs, and discuss prompt injection.
So the rules look for an *addressee* (an assistant, an AI agent, "whoever reads this") or a
*trigger* ("when the user asks about X, answer Y"), not for imperatives as such; and each
match says whether it was inside quotes (``"…"``, ``'…'``, backticks, a fenced block) or, not
quoted, came after a negation in its sentence ("never use --no-verify"). Which codes those
exempt is a tenant setting (``instruction_quoted_exempt``, ``instruction_negation_exempt``).

The catalogue (code: what it finds):

* ``AGENT_ADDRESSED``: text addressed to an assistant, agent, model or AI as its reader
  ("Assistant, always…", "AI agents reading this must…", "Claude must…", "when you (the model)
  see…", "if you are an AI…", "note for the assistant:", "future sessions:", "when you next
  summarize…", "begin every response with…", "… in every reply").
* ``TRIGGERED_DIRECTIVE``: a trigger and an order ("when the user asks about X, recommend Y",
  "whenever X comes up, state …", "if asked who …, answer …", "the correct response to any
  question about X is …").
* ``OVERRIDE_PHRASE``: ignore/disregard/forget previous instructions or "the above", "new
  instructions:", revealing or replacing the system prompt, "these instructions take precedence",
  "previous guidance is obsolete", developer mode, jailbreak, role assumption ("you are now",
  "pretend you are", "from now on respond only with …").
* ``ROLE_MARKUP``: fake role and block tags (``<system>``, ``</memory>``, ``[INST]``,
  ``<|im_start|>``, ``### System:``, ``[SYSTEM NOTE]``, ``[note from admin]``, a line opening
  ``System:`` or ``role: system``) and HTML comments (text a renderer hides).
* ``TOOL_CALL_SHAPE``: tool-call-shaped JSON (``{"tool": …, "arguments": …}``,
  ``"function_call"``, ``"tool_calls"``), a ReAct ``Action Input:`` line, "call the
  ``purge_all`` tool", or a call of one of Engram's own tools.
* ``EXFIL_URL``: a link or image whose URL carries a templated parameter (``{…}``, ``${…}``,
  ``%7B``) or a parameter named for what it would carry out (conversation, history, secret,
  token, password, prompt, memory…), or a markdown image with any query parameters. Its
  ``hosts`` say where to.
* ``EXFIL_DIRECTIVE``: an order to send the conversation, history, credentials or memories
  somewhere ("forward the chat history to …", "paste any tokens into …"), or to output
  credentials, secrets or the system prompt.
* ``CONCEAL_FROM_USER``: "do not tell the user", "without informing the user".
* ``INVISIBLE_CHARS``: zero-width characters (U+200B–U+200F, U+2060, U+FEFF) and Unicode tag
  characters (U+E0000–U+E007F).
* ``BIDI_CONTROL``: bidirectional controls (U+202A–U+202E, U+2066–U+2069).
* ``MIXED_SCRIPT``: a word mixing Latin with Cyrillic or Greek letters (a look-alike).
* ``ENCODED_BLOB``: a base64 run of 120+ characters or a hex run of 128+ (a SHA-256 digest is
  64, a commit id 40: those are not blobs).
* ``DISABLES_VERIFICATION``: advice that turns off verification or authentication
  (``--no-verify``, ``verify=False``, ``--insecure``, disable TLS/certificate checks,
  ``StrictHostKeyChecking no``, ``NODE_TLS_REJECT_UNAUTHORIZED=0``, ``sslmode=disable``,
  ``http.sslVerify false``, ``rejectUnauthorized: false``, ``curl -k``, skip authentication,
  disable 2FA, auth off, ``chmod 777``).
* ``PIPE_TO_SHELL``: a download piped into a shell (``curl … | sh``, ``wget -O- … | bash``,
  ``bash <(curl …)``, PowerShell's ``iwr … | iex``) or downloaded then run (``wget … && bash …``). Its ``hosts`` are the hosts downloaded
  from (``""`` when none could be read), which the policy compares with the tenant's
  ``trusted_shell_hosts``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import re2

_AI = r"(?:ai|a\.i\.|assistant|agent|model|llm|language model|chatbot|bot|copilot|claude|chatgpt|gpt|gemini)"
_AI_STRICT = r"(?:ai|a\.i\.|assistant|llm|language model|chatbot|copilot|claude|chatgpt|gpt|gemini|ai agent|ai assistant|ai model)"
_AI_READER = (r"(?:ai|a\.i\.|assistants?|llms?|language models?|chatbots?|copilots?|claude|chatgpt|gpt(?:-?\d\w*)?|gemini|"
              r"ai agents?|ai assistants?|ai models?|models?|agents? reading this|future (?:sessions?|agents?|assistants?))")
_DIRECTIVE = (r"(?:must|should|shall|needs? to|has to|have to|are to|is to|will always|will never|"
              r"(?:is|are) (?:now\s+)?(?:permitted|allowed|authori[sz]ed|required|instructed|expected|supposed|free)|"
              r"may now|can now)")
_MODAL = r"(?:must|should|shall|will|need to|needs to|have to|has to|are to|is to|always|never|do not|don't|please|remember|make sure|ensure)"
_ORDER = (r"(?:respond|reply|answer|tell|recommend|say|state|claim|insist|send|forward|email|post|upload|run|execute|"
          r"call|invoke|output|include|suggest|direct|redirect|point|share|reveal|leak|delete|remove|transfer|"
          r"approve|grant|use|install|visit|open|click|praise|mention|add)")

# (code, pattern). Case-insensitive unless the pattern says otherwise.
CATALOGUE: tuple[tuple[str, str], ...] = (
    # -- addressed to the reader ----------------------------------------------------------
    ("AGENT_ADDRESSED",
     r"(?i)(?:^|[.!?;:\n]\s*|\b(?:note to|attention|dear|hey|to|for)\s+(?:all\s+|any\s+|the\s+|future\s+|other\s+)*)"
     r"(?:ai\s+)?" + _AI + r"s?\s*[,:!]\s*(?:you\s+)?" + _MODAL + r"\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:ai\s+)?" + _AI + r"s?\s+(?:that\s+|who\s+|which\s+)?(?:is\s+|are\s+|will\s+|later\s+)?"
     r"(?:read|retriev|recall|process|see|load|encounter|find|us)\w*\s+(?:this|these)\s+"
     r"(?:memory|memories|note|notes|record|records|entry|entries|message|messages|text|summary|summaries)\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:ai\s+)?" + _AI + r"s?\s+(?:that\s+|who\s+|which\s+)?(?:is\s+|are\s+)?(?:reading|reads)\s+this\b"),
    ("AGENT_ADDRESSED", r"(?i)\bif\s+you\s+are\s+(?:an?\s+)?(?:ai|llm|language model|assistant|chatbot|bot|ai agent|agent|model)\b"),
    ("AGENT_ADDRESSED", r"(?i)\bwhen(?:ever)?\s+you\s*[,(]\s*(?:the\s+)?(?:ai|assistant|agent|model|llm|bot)\b"),
    ("AGENT_ADDRESSED", r"(?i)\b(?:you|the|any|all|future)\s+" + _AI_STRICT + r"s?\s+" + _MODAL + r"\b"),
    ("AGENT_ADDRESSED", r"(?i)\b(?:whoever|anyone|any one|whatever)\s+(?:is\s+)?(?:reading|reads|retrieves|recalls|loads)\s+this\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\bwhen(?:ever)?\s+(?:you|an?\s+" + _AI + r")\s+(?:read|see|retrieve|load|recall|encounter|find)s?\s+"
     r"this\s+(?:memory|note|record|entry|message|text)\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:in|for|during)\s+(?:all\s+|every\s+)?(?:future|subsequent|later)\s+(?:sessions?|conversations?|chats?)\s*,?\s*(?:you|the\s+"
     + _AI + r")\s+" + _MODAL + r"\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:note|notes|message|reminder|instructions?|memo|directive|hint|tip|warning|notice|p\.?s\.?)\s+(?:to|for)\s+"
     r"(?:the\s+|all\s+|any\s+|future\s+|every\s+|each\s+|other\s+|whichever\s+)*" + _AI_READER + r"\b"),
    ("AGENT_ADDRESSED", r"(?i)\b" + _AI_STRICT + r"s?\s+" + _DIRECTIVE + r"\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:dear|hey|hi|hello|attention|psst|listen|ok|okay|yo)\s*,?\s+(?:the\s+|all\s+|any\s+)?" + _AI_READER + r"\s*[,:!]"),
    ("AGENT_ADDRESSED", r"(?i)\(\s*(?:the\s+)?(?:ai|agent|assistant|model|llm|bot|copilot)s?\s*\)\s*[:,]"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:any|every|each|all)\s+(?:ai\s+(?:agents?|assistants?|models?)|assistants?|llms?|language models?|ai)\b"
     r"[^.\n]*?\b(?:must|should|shall|needs? to|has to|have to|is to|are to)\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:ai\s+)?" + _AI + r"s?\s+(?:that\s+|who\s+|which\s+)?(?:is\s+|are\s+)?(?:using|reading|accessing|querying|"
     r"consulting|searching)\s+(?:this|these|our)\s+(?:knowledge base|kb|memory|memories|workspace|store|data|information|"
     r"documents?|notes?|page|file|context|thread)\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:future|next|later|subsequent)\s+(?:sessions?|conversations?|chats?|agents?|assistants?|instances?|runs?)\s*"
     r"(?:[:,]|" + _DIRECTIVE + r"\b)"),
    ("AGENT_ADDRESSED",
     r"(?i)\bwhen(?:ever)?\s+you\s+(?:next\s+|later\s+|again\s+|first\s+)?(?:summari[sz]e|answer|respond|reply|write|recap|"
     r"report|see|read|retrieve|recall|load|are asked|get asked|talk to|speak to|help)\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:begin|start|end|prefix|preface|open|close|finish|sign)\s+(?:every|each|all|any|your)\s+(?:\w+\s+)?"
     r"(?:answers?|responses?|replies|summar(?:y|ies)|outputs?)\b"),
    ("AGENT_ADDRESSED",
     r"(?i)\b(?:in|to|into|at the (?:end|start|beginning|bottom|top) of)\s+(?:every|each|all|any)\s+(?:of\s+your\s+|future\s+)?"
     r"(?:answers?|replies|summar(?:y|ies)|chat responses?)\b"),
    ("AGENT_ADDRESSED", r"(?i)\b(?:your|all future|every future)\s+(?:answers|responses|replies|outputs)\s+(?:must|should|shall|will)\b"),
    ("TRIGGERED_DIRECTIVE",
     r"(?i)\b(?:when(?:ever)?|if|once|the next time|next time|each time|every time)\s+(?:the\s+|a\s+|any\s+)?"
     r"(?:user|users|someone|anyone|somebody|customer|customers|people|person|they|asked|you(?:'re| are)\s+asked)\b"
     r"[^.\n]*?\b(?:asks?|asked|mentions?|says?|types?|requests?|quer(?:y|ies)|brings? up|talks? about|inquires?|searche?s?)\b"
     r"[^.\n]*?\b(?:always\s+|instead\s+|you\s+(?:must|should)\s+|must\s+|should\s+)?" + _ORDER + r"\b"),
    ("TRIGGERED_DIRECTIVE",
     r"(?i)\b(?:when(?:ever)?|if|once|each time|every time|the next time|next time|as soon as)\b[^.,;\n]*,\s*"
     r"(?:always\s+|then\s+|just\s+|simply\s+|please\s+|immediately\s+|you\s+(?:must|should|will)\s+)?"
     r"(?:respond|reply|answer|tell (?:them|the user|users|the customer|customers|him|her|people)|recommend|suggest|say|state|"
     r"claim|insist|deny|reveal|share|ask (?:them|the user|the customer|for)|direct|redirect|point|send|forward)\b"),
    ("TRIGGERED_DIRECTIVE",
     r"(?i)\b(?:correct|right|proper|only|official|approved|standard|expected|preferred)\s+(?:response|answer|reply)\s+"
     r"(?:to|for)\s+(?:any|every|all|each|questions?|queries|requests?)\b"),
    ("AGENT_ADDRESSED", r"(?i)\b" + _AI_READER + r"\s+(?:instructions?|directives?|rules|notes?|guidance|orders)\s*:"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:ignore|disregard|forget|override|overrule|bypass|drop|discard)\s+(?:all\s+|any\s+|the\s+|your\s+|every\s+|of\s+)*"
     r"(?:previous|prior|above|earlier|preceding|existing|original|system|safety|other|old|initial)\s+(?:[a-z]+\s+)?"
     r"(?:instructions?|prompts?|rules?|directives?|guidelines?|guardrails?|policies|context|messages?|constraints?)"),
    ("OVERRIDE_PHRASE", r"(?i)\b(?:ignore|disregard)\s+(?:all|everything)\s+(?:above|before|else|previous|prior)\b"),
    ("OVERRIDE_PHRASE", r"(?i)\b(?:new|updated|real|actual|hidden|secret)\s+(?:system\s+)?instructions?\s*:"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:reveal|print|show|output|repeat|ignore|override|replace|disregard|leak|new|updated|real|hidden)\s+"
     r"(?:the\s+|your\s+|this\s+)?system\s+prompt\b|\bsystem\s+prompt\s*:"),
    ("OVERRIDE_PHRASE", r"(?i)\b(?:ignore|disregard|forget)\s+(?:all\s+|everything\s+|anything\s+)?(?:of\s+)?the\s+(?:above|previous|prior|preceding|earlier)\b"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:previous|prior|earlier|old|original|all other|other|existing|above|safety|system)\s+(?:\w+\s+)?"
     r"(?:instructions?|directives?|prompts?|guardrails|restrictions)\s+(?:(?:is|are|have been|has been)\s+)?(?:now\s+)?"
     r"(?:obsolete|void|invalid|cancel+ed|revoked|superseded|no longer (?:valid|apply|applies|in effect|matter)|outdated|"
     r"replaced|lifted|suspended|disabled)|\bthe only (?:valid|real|true) (?:instruction|rule|directive)\b"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:stop|quit|cease)\s+(?:following|obeying|applying)\s+(?:your|the|all|any|these|those|previous|prior)\s+"
     r"(?:\w+\s+)?(?:instructions?|guidelines|rules|directives?|policies|prompts?|guardrails)\b"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:forget|ignore|disregard)\s+(?:everything|anything|all(?: of)? (?:that|what))\s+(?:you\s+(?:were|have been|was|got)\s+"
     r"(?:told|taught|instructed|given)|(?:said|written|stated|above)|(?:before|above|earlier))"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:these|this|the following)\s+(?:instructions?|rules?|directives?|notes?|memor(?:y|ies))\s+"
     r"(?:take|takes|have|has)\s+(?:precedence|priority)\b"),
    ("OVERRIDE_PHRASE", r"(?i)\b(?:developer|god|dan|jailbreak|unrestricted)\s+mode\b|\bjailbr(?:eak|oken)\b"),
    ("OVERRIDE_PHRASE",
     r"(?i)(?:^|[.!?;:\n]\s*)(?:please\s+|now\s+|from now on,?\s+)?(?:pretend (?:to be|you are|you're|that you)|"
     r"act as (?:if|though|an?|the|my)|role-?play as|imagine you are|you are now|you're now|you will now act)\b"),
    ("OVERRIDE_PHRASE",
     r"(?i)\b(?:from now on|going forward|henceforth),?\s+(?:you\s+(?:must|should|will)\s+)?(?:always\s+|only\s+)?"
     r"(?:respond|reply|answer|talk|speak|write)\s+(?:only\s+)?(?:with|in|as|like|to every|to all)\b"),
    ("OVERRIDE_PHRASE", r"(?i)\b(?:ignore|bypass|skip|disable|override)\s+(?:all\s+|any\s+|your\s+|the\s+)*(?:safety|content|security)\s+(?:rules|filters?|guidelines|checks|policies|restrictions)\b"),
    ("OVERRIDE_PHRASE", r"(?i)\b(?:without|no)\s+(?:any\s+)?(?:restrictions|limitations|filters|guardrails|censorship)\b[^.\n]*\b(?:answer|respond|reply|comply|do)\b|\bno longer bound by\b"),
    # -- markup, tags, tool calls ----------------------------------------------------------
    ("ROLE_MARKUP",
     r"(?i)</?\s*(?:system|assistant|user|tool|developer|human|memory|memories|instructions?|context|im_start|im_end|"
     r"function_calls?|function_results?|tool_calls?|tool_results?|tool_use|admin|sys)\b[^<>\n]*>"),
    ("ROLE_MARKUP", r"(?i)\[/?\s*(?:inst|sys|system|system note|system message|admin note|admin message|assistant)\s*\]"),
    ("ROLE_MARKUP", r"<\|[A-Za-z_]{2,20}\|>|<<\s*/?SYS\s*>>"),
    ("ROLE_MARKUP", r"(?im)^\s*#{1,6}\s*(?:system|assistant|developer|instructions?)\b\s*(?:message|prompt)?\s*:?\s*$"),
    ("ROLE_MARKUP", r"(?im)^\s*#{1,6}\s*(?:system|assistant|developer)\s*(?:message|prompt)?\s*:"),
    ("ROLE_MARKUP", r"(?im)^\s*(?:system|developer|admin|administrator)\s*(?:message|prompt|note|override|update|notice|alert|instructions?)?\s*:"),
    ("ROLE_MARKUP",
     r"(?i)\[[^\]\n]*\b(?:note|message|instructions?|directive|override|notice|memo)\s+(?:from|by)\s+(?:the\s+)?"
     r"(?:system|admin|administrator|developer|operator|moderator)\b[^\]\n]*\]|\[\[\s*(?:system|admin)\s*\]\]"),
    ("ROLE_MARKUP", r"(?i)\bsystem\s+(?:note|notice|message|override|update|alert|instructions?)\s*:"),
    ("ROLE_MARKUP", r"(?im)^\s*override\s*:"),
    ("ROLE_MARKUP", r"(?s)<!--.*?-->"),
    ("ROLE_MARKUP", r"(?im)^\s*[\"']?role[\"']?\s*:\s*[\"']?(?:system|assistant|developer|tool)\b"),
    ("ROLE_MARKUP", r"(?i)\b(?:begin|end)\s+(?:system|admin|developer)\s+(?:prompt|instructions?|message|note)\b"),
    ("TOOL_CALL_SHAPE",
     r"(?i)[{,]\s*\"(?:tool|tool_name|function|name|action|recipient_name)\"\s*:\s*\"[^\"\n]+\"\s*,\s*"
     r"\"(?:arguments|args|parameters|params|input|action_input)\"\s*:"),
    ("TOOL_CALL_SHAPE", r"(?i)\"(?:function_call|tool_calls?|tool_use)\"\s*:"),
    ("TOOL_CALL_SHAPE", r"(?im)^\s*action[ _]input\s*:"),
    ("TOOL_CALL_SHAPE", r"(?i)\b(?:function_call|tool_call|tool_use|tool_code)\s*[:=]"),
    ("TOOL_CALL_SHAPE", r"(?i)\bengram_memory_(?:forget|withdraw|capture|request_admission)\s*\("),
    ("TOOL_CALL_SHAPE",
     r"(?i)\b(?:call|invoke|run|execute|trigger|use)\s+(?:the\s+)?`?[a-z][a-z0-9]*(?:[_.][a-z0-9]+)+`?\s+(?:tool|function|action)\b"),
    # -- links and orders that carry something out ------------------------------------------
    ("EXFIL_URL", r"(?i)https?://[^\s)\]>\"'`]*(?:\{\{?|\$\{|\$[A-Z_]{3,}|%7[bB]|\[[A-Z][A-Z0-9_]{2,}\]|<[A-Za-z][A-Za-z0-9_]{2,}>)"),
    ("EXFIL_URL",
     r"(?i)https?://[^\s)\]>\"'`]*[?&][a-z_]*(?:conversation|convo|history|chat|transcript|secret|token|password|passwd|"
     r"credential|prompt|memor(?:y|ies)|context|session_data|api_?key|cookie|exfil|dump|leak)[a-z_]*="),
    ("EXFIL_URL", r"(?i)!\[[^\]\n]*\]\(\s*<?https?://[^\s)]*\?[^\s)]*="),
    ("EXFIL_DIRECTIVE",
     r"(?i)\b(?:send|forward|email|e-mail|post|upload|copy|transmit|exfiltrate|leak|share|append|paste|publish|put|dump|"
     r"write|expose|relay|mirror|sync)\s+"
     r"(?:(?:all|any|every|the|this|these|your|their|our|full|entire|complete|whole|user's|users'|recent|current|previous)\s+)*"
     r"(?:conversations?|chat(?:\s+history|\s+logs?)?|history|transcripts?|messages|credentials?|secrets?|tokens?|"
     r"api\s+keys?|passwords?|memories|memory|context|session\s+data|environment\s+variables|env\s+vars?|\.env)\b"
     r"[^.;\n]*?\b(?:to|into|at)\b"),
    ("EXFIL_DIRECTIVE",
     r"(?i)\b(?:output|print|reveal|show|display|dump|paste|echo|cat|leak|include)\s+(?:the\s+|all\s+|any\s+|your\s+)?"
     r"(?:full\s+|entire\s+|raw\s+|complete\s+)?(?:contents?\s+of\s+)?[^.\n]*?(?:credentials|\.env\b|secrets|api[_ ]?keys?|"
     r"passwords|private keys?|id_rsa|\.aws|\.ssh|system prompt|environment variables|session tokens?|access tokens?)"),
    ("EXFIL_DIRECTIVE",
     r"(?i)\b(?:send|forward|email|e-mail|post|upload|share|copy|cc)\s+(?:a|the|an)?\s*(?:summary|copy|transcript|log|record|"
     r"export|dump|recap)\s+of\s+(?:this|the|our|every|each|all|the user's|your)\s+(?:\w+\s+)?(?:conversations?|chats?|"
     r"sessions?|messages|history|threads?|memories|calls?)\b[^.;\n]*?\b(?:to|into|at)\b"),
    ("CONCEAL_FROM_USER",
     r"(?i)\b(?:do not|don't|never|without)\s+(?:tell(?:ing)?|inform(?:ing)?|mention(?:ing)?(?:\s+this)?|reveal(?:ing)?|"
     r"alert(?:ing)?|notify(?:ing)?|warn(?:ing)?|show(?:ing)?|let(?:ting)?|inform(?:ing)?)\s+(?:it\s+|this\s+)?(?:to\s+)?(?:the\s+)?"
     r"(?:user|users|human|humans|operator|customer)\b"),
    ("CONCEAL_FROM_USER", r"(?i)\b(?:keep|hide)\s+(?:this|it)\s+(?:secret\s+|hidden\s+)?from\s+(?:the\s+)?(?:user|human|operator)s?\b"),
    # -- hidden text -------------------------------------------------------------------------
    ("INVISIBLE_CHARS", r"[\x{200B}-\x{200F}\x{2060}-\x{2064}\x{FEFF}\x{E0000}-\x{E007F}]+"),
    ("BIDI_CONTROL", r"[\x{202A}-\x{202E}\x{2066}-\x{2069}]"),
    ("MIXED_SCRIPT",
     r"\p{Latin}[\p{Latin}\p{Cyrillic}\p{Greek}]*(?:\p{Cyrillic}|\p{Greek})|(?:\p{Cyrillic}|\p{Greek})[\p{Latin}\p{Cyrillic}\p{Greek}]*\p{Latin}"),
    ("ENCODED_BLOB", r"[A-Za-z0-9+/_-]{64,}={0,2}"),  # kept when long enough: ``_is_blob``
    # -- advice that opens the door ----------------------------------------------------------
    ("DISABLES_VERIFICATION",
     r"(?i)--no-verify\b|--insecure\b|--no-check-certificate\b|--disable-(?:tls|ssl|auth\w*|security|verification)\b|"
     r"\bverify\s*=\s*false\b|\bverify_ssl\s*=\s*false\b|\bssl_verify\w*\s*[=:]\s*(?:false|0|no)\b|"
     r"\bstricthostkeychecking\s*[= ]\s*no\b|\bnode_tls_reject_unauthorized\s*=\s*['\"]?0|"
     r"\bpythonhttpsverify\s*=\s*0|\bgit_ssl_no_verify\b|\bsslmode\s*=\s*disable\b|\bsetenforce\s+0\b|"
     r"--allow-unauthenticated\b|\binsecureskipverify\s*:\s*true\b|\binsecure-skip-tls-verify\b|"
     r"\bchmod\s+(?:-r\s+)?(?:0?777|a\+rwx)\b|\bauth(?:entication)?\s*[:=]\s*(?:off|false|none|disabled)\b|"
     r"\bsslverify\s*=?\s*false\b|\brejectunauthorized\s*[:=]\s*false\b|\bcheck_hostname\s*=\s*false\b|\bcert_none\b|"
     r"\binsecure\s*[:=]\s*true\b|\btls_?verify\s*[:=]\s*(?:false|0|no)\b|--disable-web-security\b|\bverify_peer\s*[:=]\s*false\b|"
     r"\bcurl\s+(?:-[a-z]*\s+)*-[a-z]*k[a-z]*\s"),
    ("DISABLES_VERIFICATION",
     r"(?i)\b(?:disable|disabling|turn off|turning off|switch off|skip|skipping|bypass|bypassing|ignore|ignoring|remove|drop)\s+"
     r"(?:the\s+|all\s+|any\s+)?(?:tls|ssl|https|cert(?:ificate)?s?|signature|gpg|hostname|host key|2fa|mfa|"
     r"two-factor|auth(?:entication|orization)?|login|password|csrf|sandbox|integrity|checksum)\s*"
     r"(?:verification|validation|checks?|checking|requirements?)?\b"),
    ("PIPE_TO_SHELL",
     r"(?i)\b(?:curl|wget|fetch|iwr|invoke-webrequest|irm|invoke-restmethod)\b[^|\n]*\|\s*(?:sudo\s+(?:-\w+\s+)*)?"
     r"(?:ba|z|k|da|fi)?sh\b|\|\s*(?:iex|invoke-expression|python3?|perl|ruby|node)\b"),
    ("PIPE_TO_SHELL", r"(?i)\b(?:ba|z)?sh\s+(?:-c\s+)?[\"']?\s*<\(\s*(?:curl|wget)\b[^)\n]*\)"),
    ("PIPE_TO_SHELL", r"(?i)\b(?:ba|z)?sh\s+-c\s+[\"']?\$\(\s*(?:curl|wget)\b[^)\n]*\)"),
    ("PIPE_TO_SHELL",
     r"(?i)\b(?:curl|wget)\b[^\n|]*?(?:&&|;)\s*(?:chmod\s+\+x\s+\S+\s*(?:&&|;)\s*)?(?:sudo\s+)?"
     r"(?:(?:ba|z|k|da)?sh\s+\S+|python3?\s+\S+|\./\S+)"),
)

# The codes whose matches carry hosts (where the download or the link goes).
HOST_CODES = frozenset({"PIPE_TO_SHELL", "EXFIL_URL"})
CODES = tuple(dict.fromkeys(code for code, _ in CATALOGUE))

_NEGATION = re2.compile(
    rb"(?i)\b(?:never|not|don't|dont|do not|doesn't|must not|mustn't|shouldn't|should not|cannot|can't|avoid|avoiding|"
    rb"stop|stopped|no longer|instead of|rather than|forbid|forbidden|prohibit|prohibited|ban|banned|disallow|"
    rb"without|refuse|reject|rejected|warn|warning|dangerous|unsafe|insecure|bad practice|anti-pattern)\b")
_NEGATION_AFTER = re2.compile(
    rb"(?i)\b(?:must|should|shall|can|may|will)\s+(?:never|not)\b|\b(?:mustn't|shouldn't|can't|won't)\b|"
    rb"\b(?:is|are)\s+(?:forbidden|prohibited|banned|not allowed|not permitted|dangerous|unsafe|insecure|a bad idea)\b")
_SENTENCE_END = re2.compile(rb"[.!?;\n]")
_QUOTED = re2.compile(
    br"(?s)```.*?```|`[^`\n]+`|\"[^\"\n]+\"|\x{201C}[^\x{201D}\n]+\x{201D}|"
    br"\x{2018}[^\x{2019}\n]+\x{2019}|(?:^|[\s(\[:])'[^'\n]+'")
_URL_HOST = re2.compile(r"(?i)\b(?:https?|ftp)://(?:[^\s/@?#]*@)?([a-z0-9][a-z0-9.-]*[a-z0-9]|[a-z0-9])")
_BARE_HOST = re2.compile(r"(?i)(?:^|[\s\"'=])((?:[a-z0-9][a-z0-9-]*\.)+[a-z]{2,24})(?:[:/\s\"']|$)")
_LOOKBACK = 60
_MAX_HOSTS = 8

# Compiled for UTF-8 bytes: match offsets are byte offsets, so examining a match costs the same
# wherever it is (offsets into a ``str`` are mapped back from bytes at each match).
COMPILED: tuple[tuple[str, Any], ...] = tuple((code, re2.compile(pattern.encode())) for code, pattern in CATALOGUE)


def _prefilter() -> Any:
    """Every rule in one RE2 set: one linear pass says which rules match anywhere (most texts:
    none), and only those are run for their matches. Its DFA gets room enough for the whole
    catalogue (``tests/unit/test_content_signals.py`` checks the set agrees with the rules)."""
    options = re2.Options()
    options.max_mem = 64 << 20
    rules = re2.Set.SearchSet(options)
    for _, pattern in CATALOGUE:
        rules.Add(pattern.encode())
    rules.Compile()
    return rules


RULE_SET = _prefilter()


@dataclass
class _Tally:
    count: int = 0
    quoted: int = 0
    negated: int = 0
    kinds: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)


def _quoted_spans(text: bytes) -> tuple[list[int], list[int]]:
    starts: list[int] = []
    ends: list[int] = []
    for m in _QUOTED.finditer(text):
        starts.append(m.start())
        ends.append(m.end())
    return starts, ends


def _inside(spans: tuple[list[int], list[int]], start: int, end: int) -> bool:
    starts, ends = spans
    i = bisect.bisect_right(starts, start) - 1
    return i >= 0 and ends[i] >= end


def _negated(text: bytes, start: int, end: int) -> bool:
    """A negation earlier in the match's sentence, within ``_LOOKBACK`` characters, or one that
    follows it there ("``GIT_SSL_NO_VERIFY`` must never be set")."""
    window = text[max(0, start - _LOOKBACK):start]
    cut = None
    for m in _SENTENCE_END.finditer(window):
        cut = m.end()
    if cut is not None:
        window = window[cut:]
    if _NEGATION.search(window) is not None:
        return True
    after = text[end:end + _LOOKBACK]
    stop = _SENTENCE_END.search(after)
    return _NEGATION_AFTER.search(after[:stop.start()] if stop else after) is not None


def _hosts(raw: bytes) -> set[str]:
    matched = raw.decode("utf-8", "replace")
    hosts = {m.group(1).lower().rstrip(".") for m in _URL_HOST.finditer(matched)}
    if not hosts:
        hosts = {m.group(1).lower() for m in _BARE_HOST.finditer(matched)}
    return {h for h in hosts if len(h) <= 253}


_HEX = re2.compile(rb"[0-9a-fA-F]+")
_MAX_EXAMINED = 64  # matches examined per rule and component: counts saturate there


def _is_blob(run: bytes) -> bool:
    """A base64-like run of 120+ characters, or a hex run of 128+ (digests and ids are shorter)."""
    if _HEX.fullmatch(run):
        return len(run) >= 128
    return len(run) >= 120


def scan(components: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """The instruction signals of ``components`` ((kind, text) pairs), sorted by code: each
    ``{"code", "count", "quoted", "negated", "kinds"}`` and, for ``HOST_CODES``, ``"hosts"``.
    ``quoted``: matches inside quotes; ``negated``: matches not quoted that follow a negation in
    their sentence; so ``count - quoted - negated`` matches stand plainly. ``hosts`` holds the
    hosts of matches not negated (``""`` for one whose host could not be read). At most
    ``_MAX_EXAMINED`` matches of a rule are examined per component (a count says "at least"):
    the work per text stays linear whatever it repeats."""
    tallies: dict[str, _Tally] = {}
    for kind, chars in components:
        text = chars.encode("utf-8", "surrogatepass")
        spans: tuple[list[int], list[int]] | None = None
        for code, regex in (COMPILED[i] for i in sorted(RULE_SET.Match(text) or ())):
            for examined, m in enumerate(regex.finditer(text)):
                if examined == _MAX_EXAMINED:
                    break
                if spans is None:
                    spans = _quoted_spans(text)
                if code == "ENCODED_BLOB" and not _is_blob(m.group(0)):
                    continue
                tally = tallies.setdefault(code, _Tally())
                tally.count += 1
                tally.kinds.add(kind)
                negated = False
                if _inside(spans, m.start(), m.end()):
                    tally.quoted += 1
                elif _negated(text, m.start(), m.end()):
                    tally.negated += 1
                    negated = True
                if code in HOST_CODES and not negated and len(tally.hosts) < _MAX_HOSTS:
                    tally.hosts |= _hosts(m.group(0)) or {""}
    out = []
    for code in sorted(tallies):
        t = tallies[code]
        entry: dict[str, Any] = {"code": code, "count": t.count, "quoted": t.quoted, "negated": t.negated,
                                 "kinds": sorted(t.kinds)}
        if code in HOST_CODES:
            entry["hosts"] = sorted(t.hosts)[:_MAX_HOSTS]
        out.append(entry)
    return out
