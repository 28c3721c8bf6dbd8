"""Config files are typed data: defaults, overrides, and one-line errors naming the field."""

import pytest

from stlsgd.algorithms import PlanContext
from stlsgd.errors import ConfigError
from stlsgd.experiments.config import load_config, parse_value


def write(tmp_path, text, name="c.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_and_yaml_load_the_same_experiment(tmp_path):
    toml = write(tmp_path, '[data]\ndataset = "a9a"\n[algorithm]\nmethod = "local_sgd"\nk = 200\nlr = 3.2\n')
    yaml = write(tmp_path, "data: {dataset: a9a}\nalgorithm: {method: local_sgd, k: 200, lr: 3.2}\n", "c.yaml")
    assert load_config(toml) == load_config(yaml)
    exp = load_config(toml)
    assert (exp.data.num_clients, exp.data.partition, exp.run.target_gap) == (32, "shared", 1e-4)


def test_overrides_parse_toml_literals(tmp_path):
    path = write(tmp_path, "")
    exp = load_config(
        path, ["algorithm.lr=1e-2", "data.partition=noniid", "run.target_gap=null", "algorithm.iid=false"]
    )
    assert exp.algorithm.lr == 0.01 and exp.data.partition == "noniid"
    assert exp.run.target_gap is None and exp.algorithm.iid is False
    assert parse_value("[1, 2]") == [1, 2] and parse_value("a9a") == "a9a"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[algorithm]\nlr = 0\n", "algorithm.lr"),
        ("[algorithm]\nk = 0.5\n", "algorithm.k"),
        ('[algorithm]\nmethod = "local_sgd"\nk = 2.5\n', "algorithm.k"),
        ('[algorithm]\nmethod = "adam"\n', "algorithm.method"),
        ('[algorithm]\nmethod = "stl_nc"\nT1 = 10\n', "algorithm.gamma"),
        ('[algorithm]\nmethod = "stl_nc"\nT1 = 10\ngamma = -1\n', "algorithm.gamma"),
        ("[data]\ns = 150\n", "data.s"),
        ('[data]\nnum_clients = "many"\n', "data.num_clients"),
        ("[run]\ntarget_gap = 1e-4\nmax_iter = 3\n", "run.max_iter"),
        ("[nonsense]\n", "nonsense"),
    ],
)
def test_invalid_fields_are_named(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: {field}:") and "\n" not in message


def test_syntax_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"c\.toml: invalid TOML"):
        load_config(write(tmp_path, "[data\n"))
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: invalid YAML"):
        load_config(write(tmp_path, "data:\n  - [\n", "c.yaml"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")


def test_stl_sc_first_stage_from_the_lambda_rule(tmp_path):
    exp = load_config(write(tmp_path, '[algorithm]\nmethod = "stl_sc"\nlr = 32\nk = 100\n'))
    plan = exp.algorithm.plan(PlanContext(num_samples=32561, num_clients=32, lam=1 / 32561, iid=True))
    assert (plan.T1, plan.k1, plan.iid) == (1018, 100, True)
    exp = load_config(
        write(
            tmp_path,
            '[algorithm]\nmethod = "stl_nc"\nlr = 0.1\nk = 5\nT1_epochs = 2\ngamma = 100\noption = 2\nbatch = 64\n',
        )
    )
    plan = exp.algorithm.plan(PlanContext(num_samples=50000, num_clients=8, lam=1e-5, iid=False))
    # 2 epochs of 50,000 samples at 8 clients x 64 = 196 iterations; Non-IID growth sqrt(s).
    assert (plan.T1, plan.option, plan.gamma, plan.iid) == (196, 2, 100.0, False)


def test_toml_can_switch_a_stop_rule_off(tmp_path):
    exp = load_config(write(tmp_path, '[run]\ntarget_gap = "none"\ntarget_accuracy = 0.99\nmax_iterations = "off"\n'))
    assert exp.run.target_gap is None and exp.run.max_iterations is None and exp.run.target_accuracy == 0.99
    with pytest.raises(ConfigError, match="run.target_gap"):
        load_config(write(tmp_path, '[run]\ntarget_gap = "soon"\n'))
