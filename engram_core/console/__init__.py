"""`engram console`: the web application people use to do what Engram leaves to people
(docs/console.md). A host service of its own: it reaches the core over gRPC with its own trusted
host key, signs each call's context in the name of the person who acts (so the core audits that
person), and asks the Rego family ``engram/console`` what that person may do on each scope."""
