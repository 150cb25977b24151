"""Exercise checks for the lessons: each returns a :class:`helpers.feedback.Feedback`.

One module per lesson, named by its topic as in ``kernels/``, ``experiments/`` and
``records/`` (``memory_wall``, ``roofline``, ``fusion``, ...). A check computes the expected
answer from the course's own napkin math (:mod:`helpers.intensity`), the hardware table
(:mod:`helpers.hardware`) or a measurement record, never from a typed-in number, and
says what is wrong and by how much. An unanswered exercise (``answer = ...``) gets
"no answer yet", not a failure.
"""
