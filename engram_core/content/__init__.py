"""Facts about a memory's content that the admission and capture policies decide on (issue 59).

The core computes them; Rego decides what they mean. Every fact is a catalogue code, a count,
a score, a kind, a scheme, a host or a record id: never the memory's text, so the policy
input and the decision log stay content-free.

* ``instructions``: what in the text addresses the future reader rather than recording
  knowledge (an RE2 catalogue, linear time).
* ``provenance``: what the citations are (schemes and hosts).
* ``services.content_similarity``: how a candidate compares with a current record's text (a
  restatement, or a different decision about the same thing; it uses the lexical analyzer).
"""
