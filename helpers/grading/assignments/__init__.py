"""The graded assignments, one module per lesson topic (``vector_add`` grades lesson 03).

Each module defines ``ASSIGNMENT`` (its parts, named after the notebook it grades) and the
``check_*`` functions its notebook calls; :mod:`helpers.grading.registry` finds them here.
"""
