"""``./course record``: with no names it measures every experiment this machine can run,
skipping (and naming) those that need more GPUs; a name asked for fails loudly."""

import pytest

from helpers import record, records, runtime


@pytest.fixture
def two_experiments(monkeypatch, tmp_path):
    measured = []

    def measure(name):
        if name == "needs_four_gpus":
            raise runtime.NeedsGPUError("expert parallelism is measured on 2 or more GPUs")
        measured.append(name)
        return name

    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    monkeypatch.setattr(record.experiments, "load_all",
                        lambda: {"needs_four_gpus": None, "single_gpu": None})
    monkeypatch.setattr(records, "measure", measure)
    monkeypatch.setattr(records, "write", lambda rec, out: tmp_path / f"{rec}.json")
    return measured


def test_all_skips_what_needs_more_gpus_and_says_why(two_experiments, capsys):
    assert record.main([]) == 0
    assert two_experiments == ["single_gpu"]
    assert "needs_four_gpus: skipped, expert parallelism" in capsys.readouterr().err


def test_a_named_experiment_that_cannot_run_fails(two_experiments):
    with pytest.raises(runtime.NeedsGPUError):
        record.main(["needs_four_gpus"])


@pytest.fixture
def one_experiment(monkeypatch, tmp_path):
    asked = []

    def drawn(seed=None, part="1/1"):
        return {}

    def measure(name, **options):
        asked.append((name, options))
        return name

    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    monkeypatch.setattr(record.experiments, "load_all", lambda: {"drawn": drawn})
    monkeypatch.setattr(records, "measure", measure)
    monkeypatch.setattr(records, "write", lambda rec, out: tmp_path / f"{rec}.json")
    return asked


def test_options_reach_the_experiment_as_its_arguments(one_experiment):
    assert record.main(["drawn", "--option", "part=2/3", "--option", "seed=17"]) == 0
    assert one_experiment == [("drawn", {"part": "2/3", "seed": 17})]


@pytest.mark.parametrize("argv, says", [
    (["--option", "seed=1"], "name exactly one"),
    (["drawn", "--option", "seed"], "NAME=VALUE"),
    (["drawn", "--option", "count=4"], "['part', 'seed']"),
    (["drawn", "--option", "seed=1", "--option", "seed=2"], "given twice"),
])
def test_an_option_that_cannot_be_given_is_refused(one_experiment, capsys, argv, says):
    assert record.main(argv) == 2
    assert says in capsys.readouterr().err and one_experiment == []


def test_an_option_the_experiment_refuses_is_reported_without_a_traceback(one_experiment,
                                                                         monkeypatch, capsys):
    def refuse(name, **options):
        raise ValueError("part 2/2 continues part 1/2: pass earlier=<the JSON file part 1 wrote>")

    monkeypatch.setattr(records, "measure", refuse)
    assert record.main(["drawn", "--option", "part=2/2"]) == 2
    assert "./course record drawn: part 2/2 continues" in capsys.readouterr().err
    with pytest.raises(ValueError):                  # without options: a bug, shown whole
        record.main(["drawn"])
