"""Request and response bodies of the REST API, one module per resource, in families
``XCreate`` (what a client sends to make one), ``XUpdate`` (what it may change), ``XPublic``
(one, as returned) and ``XsPublic`` (a page of them)."""
