"""Malformed or mistyped configuration (docs/errors.md, "Configuration"): every way a user
can hand one over (`gradleak <cmd> --config`, `snakemake` with the embedded default, with
`--configfile`, with `--config key=value`) fails before any job starts, with exit status
!= 0 and one line naming the key path, the value and what was expected."""

from __future__ import annotations

import subprocess

import pytest
import torch
from project import ENV, SNAKEMAKE, copy_project, run

from gradleak import cli
from gradleak.utils.io import save_torch

BASE = "cases: [{dataset: digits, model: lenet}]\nattacks: {dlg: {}}\n"
DISTINCT_16 = "attack: {victims: {distinct_labels: true}, protocol: {batch_size: 16}}\n"
LAYER_99 = "defenses: {layer_noise: {strengths: [0.1], params: {layer: body.99}}}\n"

# (name, YAML appended to BASE, what the one error line must contain)
BAD = [
    ("yaml_syntax", "fl: {rounds: 3\n", ["is not valid YAML/JSON", "line"]),
    ("nested_misspelled_key", "attacks: {dlg: {stopper: {kind: hybrid, treshold: 1}}}\n",
     ["unknown key 'attacks.dlg.stopper.treshold'", "threshold"]),
    ("misspelled_defense_param", "defenses: {censor: {strengths: [2], params: {stepp: 1}}}\n",
     ["unknown key 'defenses.censor.params.stepp'", "'step'"]),
    ("wrong_type", "fl: {rounds: many}\n", ["'fl.rounds'", "'many'", "integer"]),
    ("float_for_integer", "fl: {rounds: 4.0}\n", ["'fl.rounds'", "4.0", "integer"]),
    ("nan", "fl: {local_lr: .nan}\n", ["'fl.local_lr'", "NaN", "finite"]),
    ("inf", "defenses: {dp_gaussian: {strengths: [.inf]}}\n",
     ["'defenses.dp_gaussian.strengths[0]'", "finite"]),
    ("empty_number", "fl: {rounds: }\n", ["'fl.rounds'", "None", "integer"]),
    ("out_of_range", "attack: {victims: {count: 0}}\n",
     ["'attack.victims.count'", "0", "minimum of 1"]),
    # the attack: section before its split: the new path named
    ("flat_attack_key", "attack: {batch_size: 2}\n",
     ["'attack.batch_size'", "'attack.protocol.batch_size'", "split into"]),
    ("flat_victims", "attack: {victims: 3}\n", ["'attack.victims'", "'attack.victims.count'"]),
    ("splits_over_one", "datasets: {digits: {splits: {train: 0.9, public: 0.9, test: 0.9}}}\n",
     ["'datasets.digits.splits'", "2.7", "at most 1"]),
    ("victims_beyond_the_data", "attack: {victims: {count: 600}, protocol: {batch_size: 8}}\n",
     ["'attack.victims.count' x 'attack.protocol.batch_size'", "4800", "at most"]),
    ("more_victims_for_one_attack", "attack: {victims: {count: 2, by_attack: {dlg: 5}}}\n",
     ["'attack.victims.by_attack.dlg'", "5", "'attack.victims.count' 2"]),
    ("adaptive_attack_not_wrappable", "attack: {attacker: {adaptive: [dlg]}}\n",
     ["'attack.attacker.adaptive[0]'", "'dlg'", "EOT", "expected one of []"]),
    ("attack_round_after_training", "fl: {rounds: 10}\nattack: {protocol: {round: 11}}\n",
     ["'attack.protocol.round'", "11", "0..10"]),
    ("repeated_seed", "fl: {seeds: [0, 0]}\n", ["'fl.seeds'", "[0, 0]", "distinct"]),
    ("gan_split_misspelled", "gan: {split: publc}\n", ["'gan.split'", "'publc'", "public"]),
    ("zoo_smaller_than_asked", "attribute: {zoo_size: 4}\ndefenses: {recupfl: "
     "{strengths: [0.001], params: {zoo_models: 5}}}\n",
     ["'defenses.recupfl.params.zoo_models'", "5", "'attribute.zoo_size' 4", "at most 4"]),
    ("attribute_defense_not_configured", "attribute: {defenses: [none, dp_gausian]}\n",
     ["'attribute.defenses[1]'", "'dp_gausian'", "configured defense label"]),
    ("more_clients_than_images", "cases: [{dataset: digits, model: lenet, "
     "partition: {clients: 5000}}]\n", ["'cases[0].partition.clients'", "5000", "at most"]),
    # case fields outside its folder name would share one results folder
    ("cases_differing_in_init_only", "cases: [{dataset: digits, model: lenet}, {dataset: "
     "digits, model: lenet, uniform_init: false}]\n",
     ["'cases[1]'", "the same case as 'cases[0]'", "results folder", "uniform_init"]),
    ("iid_cases_differing_in_alpha_only", "cases: [{dataset: digits, model: lenet, partition: "
     "{alpha: 0.1}}, {dataset: digits, model: lenet, partition: {alpha: 0.9}}]\n",
     ["'cases[1]'", "the same case as 'cases[0]'", "iid"]),
    ("case_name_key", "cases: [{dataset: digits, model: lenet, name: ../x}]\n",
     ["unknown key 'cases[0].name'", "'dataset'"]),
    # GIAS Fig. 6: GIML's kept steps and the prior's dataset, before any job
    ("giml_step_not_kept", "attacks: {g: {attack: giml, step: 3}}\n"
     "giml: {outer_steps: 4, checkpoints: [0, 2]}\n",
     ["'attacks.g.step'", "GIML step 3 is not kept", "expected one of [0, 2, 4]"]),
    ("swept_giml_step_not_kept", "attacks: {g: {attack: giml}}\ngiml: {outer_steps: 4}\n"
     "targets: {t: {title: t, select: [{attacks: [g], sweep: {attacks.g.step: [0]}}]}}\n",
     ["sweep[attacks.g.step]", "GIML step 0 is not kept", "expected one of [4]"]),
    ("step_on_gias", "attacks: {g: {attack: gias, step: 2}}\n",
     ["'attacks.g.step'", "gias has none", "expected null"]),
    ("giml_checkpoint_after_the_last_step", "giml: {outer_steps: 4, checkpoints: [0, 5]}\n",
     ["'giml.checkpoints'", "step 5", "0..4"]),
    ("prior_dataset_unknown", "attacks: {g: {attack: gias, prior_dataset: cifar}}\n",
     ["'attacks.g.prior_dataset'", "'cifar'", "is not one of"]),
    ("prior_dataset_without_the_gan_split", "attacks: {g: {attack: gias, prior_dataset: "
     "natural}}\n", ["'attacks.g.prior_dataset'", "'natural'", "'gan.split' 'public'",
                     "['test', 'train']"]),
    ("prior_dataset_on_giml", "attacks: {g: {attack: giml, prior_dataset: natural}}\n",
     ["'attacks.g.prior_dataset'", "meta-learned", "expected null"]),
    # issue 49: what the attack or FL job would meet hours later
    ("distinct_labels_beyond_the_classes", DISTINCT_16,
     ["'attack.protocol.batch_size' 16", "'attack.victims.distinct_labels' true",
      "'digits' has 10 classes", "expected at most 10"]),
    ("swept_batch_beyond_the_classes", "attack: {victims: {distinct_labels: true}}\n"
     "targets: {t: {title: t, select: [{sweep: {attack.protocol.batch_size: [2, 16]}}]}}\n",
     ["sweep[attack.protocol.batch_size]'", "'attack.protocol.batch_size' 16",
      "'digits' has 10 classes", "expected at most 10"]),
    ("layer_noise_layer_name_absent", LAYER_99,
     ["'defenses.layer_noise.params.layer'", "'body.99'", "case digits/lenet",
      "['body.0', 'body.2', 'body.4', 'fc']"]),
    ("layer_noise_layer_index_absent", LAYER_99.replace("body.99", "40"),
     ["'defenses.layer_noise.params.layer'", " 40 ", "case digits/lenet", "1 .. 4"]),
    ("swept_layer_noise_layer_absent", "defenses: {layer_noise: {strengths: [0.1]}}\n"
     "targets: {t: {title: t, select: [{sweep: {defenses.layer_noise.params.layer: [1, 5]}}]}}\n",
     ["sweep[defenses.layer_noise.params.layer].layer'", " 5 ", "case digits/lenet"]),
]


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


@pytest.mark.parametrize("name, extra, expected", BAD, ids=[b[0] for b in BAD])
def test_gradleak_validate_names_key_value_and_expectation(tmp_path, capsys, name, extra,
                                                          expected):
    path = tmp_path / f"{name}.yaml"
    path.write_text(BASE + extra)
    assert cli.main(["validate", "--config", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("gradleak validate: error: invalid config")
    for part in expected:
        assert part in line, line


@pytest.mark.parametrize("content, expected", [
    (b"\xff\xfe\x00fl: 1", ["not a UTF-8 text file", "byte 0"]),
    (b"- a\n- b\n", ["must hold a mapping of keys", "list"]),
], ids=["binary", "top_level_list"])
def test_a_file_that_is_no_mapping_is_named(tmp_path, capsys, content, expected):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    assert cli.main(["plan", "--config", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(path) in line and all(part in line for part in expected)


def test_a_missing_config_file_is_named(tmp_path, capsys):
    assert cli.main(["fl-run", "--config", str(tmp_path / "nope.yaml"), "--case", "c",
                     "--setting", "none-0", "--seed", "0"]) == 2
    assert "config file not found: " + str(tmp_path / "nope.yaml") in \
        one_error_line(capsys.readouterr().err)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return copy_project(tmp_path_factory.mktemp("config_errors"))


def snakemake_fails(root, *args) -> str:
    proc = run([*SNAKEMAKE, "-n", "--cores", "1", *args], root, check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gradleak: ")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (root / "results" / "config.resolved.json").exists(), "a job could start"
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("extra, args, expected", [
    ("attacks: {dlg: {stopper: {kind: hybrid, treshold: 1}}}\n", [],
     ["unknown key 'attacks.dlg.stopper.treshold'"]),
    ("", ["--config", "fl={'local_lr': .nan}"], ["'fl.local_lr'", "NaN"]),
], ids=["configfile_nested_key", "override_nan"])
def test_snakemake_fails_before_any_job_with_one_line(project, tmp_path, extra, args, expected):
    """The Snakefile validates with the function `gradleak validate` runs (the cases above):
    one error through --configfile, one through --config."""
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + extra)
    line = snakemake_fails(project, "--configfile", str(path), *args)
    assert all(part in line for part in expected), line


def test_a_swept_value_is_checked_on_its_selection_s_cases_only(tmp_path, capsys):
    """GIAS Fig. 5 sweeps batches of up to 32 different labels on ImageNet alone: a case of
    fewer classes outside the selection does not refuse it."""
    path = tmp_path / "c.yaml"
    path.write_text("cases: [{dataset: digits, model: lenet}, {dataset: cifar100, model: "
                    "lenet}]\nattacks: {dlg: {}}\nattack: {victims: {distinct_labels: true}}\n"
                    "targets: {t: {title: t, select: [{datasets: [cifar100], sweep: "
                    "{attack.protocol.batch_size: [16, 32]}}]}}\n")
    assert cli.main(["validate", "--config", str(path)]) == 0, capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("extra, expected", [
    (DISTINCT_16, ["gradleak: invalid config: 'attack.protocol.batch_size' 16", "at most 10"]),
    (LAYER_99, ["gradleak: invalid config: 'defenses.layer_noise.params.layer': 'body.99'"]),
    ("gan: {kind: stylegan2, weights: WEIGHTS}\n",
     ["gradleak: gan.weights: WEIGHTS does not fit the StyleGAN2 generator", "missing key"]),
], ids=["distinct_labels_beyond_the_classes", "layer_noise_layer_absent",
        "generator_weights_of_other_keys"])
def test_snakemake_refuses_what_a_job_would_meet_hours_later(project, tmp_path, extra,
                                                             expected):
    """Issue 49: a batch of more different labels than the dataset has (the attack job), a
    layer the model lacks (the FL job), a generator file of other keys (the attack job)."""
    weights = save_torch(tmp_path / "g_ema.pt", {"g_ema": {"not.a.stylegan.key": torch.zeros(1)}})
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + extra.replace("WEIGHTS", str(weights)))
    line = snakemake_fails(project, "--configfile", str(path))
    assert all(part.replace("WEIGHTS", str(weights)) in line for part in expected), line


TARGET = ("{title: t, select: [{defenses: [none], attacks: [dlg]}], "
          "table: {rows: [defense], metrics: [psnr]}}")
LABELS = [
    ("defenses: {DP: {defense: dp_gaussian, strengths: [0.1]}}\n", "'defenses.DP': 'DP'"),
    ("defenses: {'a/b': {defense: dp_gaussian, strengths: [0.1]}}\n", "'defenses.a/b': 'a/b'"),
    ("defenses: {'../up': {defense: pruning, strengths: [0.5]}}\n",
     "'defenses.../up': '../up'"),
    ("defenses: {dp-low: {defense: dp_gaussian, strengths: [0.1]}}\n",
     "'defenses.dp-low': 'dp-low'"),
    ("defenses: {'my dp': {defense: dp_gaussian, strengths: [0.1]}}\n",
     "'defenses.my dp': 'my dp'"),
    ("attacks: {'ig/x': {attack: inverting_gradients}}\n", "'attacks.ig/x': 'ig/x'"),
    ("attacks: {IG: {attack: inverting_gradients}}\n", "'attacks.IG': 'IG'"),
    (f"targets: {{'../t': {TARGET}}}\n", "'targets.../t': '../t'"),
    (f"targets: {{Table1: {TARGET}}}\n", "'targets.Table1': 'Table1'"),
]
LABEL_IDS = ["upper_case", "slash", "parent_folder", "dash", "space", "attack_slash",
             "attack_upper_case", "target_parent_folder", "target_upper_case"]


@pytest.mark.parametrize("extra, expected", LABELS, ids=LABEL_IDS)
def test_a_label_that_cannot_name_a_folder_is_refused(tmp_path, capsys, extra, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + extra)
    assert cli.main(["validate", "--config", str(path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert f"invalid config: {expected} is not a valid " in line, line
    assert "expected a lower-case name" in line


@pytest.mark.slow
def test_snakemake_refuses_a_label_before_any_job(project, tmp_path):
    """A target named '../t' would write beside the project: refused before any job."""
    path = tmp_path / "bad.yaml"
    path.write_text(BASE + LABELS[LABEL_IDS.index("target_parent_folder")][0])
    line = snakemake_fails(project, "--configfile", str(path))
    assert line.startswith("gradleak: invalid config: 'targets.../t': '../t' is not a valid ")
    assert not (project / "results").exists() and not (project.parent / "t").exists()


@pytest.mark.slow
def test_snakemake_names_a_syntax_error_in_the_embedded_default(tmp_path):
    root = copy_project(tmp_path / "project")
    default = root / "config" / "config.yaml"
    default.write_text(default.read_text() + "\nfl: {rounds: 3\n")
    line = snakemake_fails(root)
    assert "config/config.yaml is not valid YAML/JSON" in line and "line" in line


@pytest.mark.slow
@pytest.mark.parametrize("override, key", [
    (["fll=1"], "unknown key 'fll'"),
    (["defenses={'pruning': {'strengths': [-0.5]}}"], "'defenses.pruning.strengths[0]'"),
])
def test_bad_config_fails_before_any_job_with_one_line(tmp_path, override, key):
    """--config overrides on the embedded default, through Snakemake."""
    root = copy_project(tmp_path / "project")
    proc = run([*SNAKEMAKE, "--cores", "1", "--config", *override], root, check=False)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if key in line]
    assert len(lines) == 1, proc.stderr
    assert "gradleak: invalid config" in lines[0]
    assert not (root / "results").exists()


@pytest.mark.slow
def test_a_bad_cluster_variable_fails_before_any_job_with_one_line(tmp_path):
    root = copy_project(tmp_path / "project")
    proc = subprocess.run([*SNAKEMAKE, "-n", "--configfile", "config/test.yaml"], cwd=root,
                          env={**ENV, "GRADLEAK_SLURM_GPUS": "two"}, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "gradleak: GRADLEAK_SLURM_GPUS='two': expected a number" in proc.stderr.splitlines()
