"""One second of start-up that no process of the course needs: jsonschema's IRI grammar.

Every process that reads a notebook imports ``nbformat``, which validates notebooks with
``jsonschema``. When the optional package ``rfc3987_syntax`` is installed (JupyterLab's
``jupyter-events`` pulls it in), ``jsonschema`` imports it to check the ``"iri"`` string
format, and that import builds an Earley parser from a grammar file: 1.0 s of CPU, in
every pytest worker, every grader and every notebook tool, whether or not anything is
ever checked against that format. No notebook schema uses it.

Marking the module absent before ``jsonschema`` is first imported makes ``jsonschema``
skip that one format, exactly as where the package is not installed; nothing else changes.
It must come before ``nbformat``: the grader imports this module first, and pytest loads it
as a plugin (``-p helpers.fast_start`` in ``pyproject.toml``) before nbval's plugin, which
imports ``nbformat`` as it loads. In a process where ``jsonschema`` is already imported it
does nothing.
"""

import sys

if "jsonschema" not in sys.modules:
    sys.modules.setdefault("rfc3987_syntax", None)   # `import rfc3987_syntax` now raises
