"""The syllabus in helpers, the notebooks on disk and the README agree."""

import re

from helpers.syllabus import LESSONS, ROOT


def test_every_notebook_is_a_lesson_in_order():
    on_disk = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    listed = [lesson.file for lesson in LESSONS]
    assert set(on_disk) <= set(listed), f"notebooks not in helpers.syllabus: {set(on_disk) - set(listed)}"
    assert listed == sorted(listed)


def test_readme_lists_every_lesson():
    readme = (ROOT / "README.md").read_text()
    for lesson in LESSONS:
        assert lesson.title in readme, f"README's syllabus lacks {lesson.title!r}"


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if target.startswith("http"):
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_readme_has_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "./course lab" in readme and "./course test" in readme
    ci = ROOT / ".ci" / "run"           # the course's CI (a student release has none)
    assert not ci.parent.exists() or "exec ./course test" in ci.read_text()


# A lesson is read in one sitting: its prose (markdown cells, every whitespace-separated
# word, formulas and links included) stays at most this long; the course's own machinery
# belongs in the helpers' docstrings.
MAX_LESSON_WORDS = 2500


def markdown_words(path) -> int:
    import json

    cells = json.loads(path.read_text())["cells"]
    return sum(len(re.findall(r"\S+", "".join(c["source"]))) for c in cells
               if c["cell_type"] == "markdown")


def test_every_lesson_reads_in_one_sitting():
    long = {lesson.file: n for lesson in LESSONS
            if (n := markdown_words(ROOT / "notebooks" / lesson.file)) > MAX_LESSON_WORDS}
    assert not long, (f"lessons over {MAX_LESSON_WORDS:,} markdown words: {long}; cut repetition "
                      "and move the course's machinery into the helpers' docstrings")
