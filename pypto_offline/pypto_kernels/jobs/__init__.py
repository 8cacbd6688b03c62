"""How the kernel stage runs PyPTO: the typed job protocol between the build and its workers
(``protocol``, standard library only), the ``Executor`` interface with its local fork-server
implementation and the retry of left candidates (``executor``), the processes (``processes``),
the build's threads (``pool``) and the Ray executor (``ray``). docs/architecture.md, "Jobs".
"""
