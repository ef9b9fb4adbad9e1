"""``state_of(trainer)``: a trainer's state found by walking its attributes, named by attribute path, in a
form ``records.state`` digests (components whose leaves are bytes, not object reprs)."""

from __future__ import annotations

import copy
import logging
import random
import threading

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pytest_resume_check import state_of  # noqa: E402
from pytest_resume_check.ids import WithIds  # noqa: E402
from pytest_resume_check.records import state as st  # noqa: E402


class Config:
    def __init__(self):
        self.lr = 0.01


class FakeProcess:
    """A process by duck typing (a pid and a poll), holding a number that must not be reported."""

    def __init__(self):
        self.pid = 4242
        self.returncode = 0

    def poll(self):
        return self.returncode


class Trainer:
    def __init__(self, file):
        self.model = torch.nn.Linear(3, 2)
        self.ema_model = copy.deepcopy(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.01)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2)
        self.scaler = torch.amp.GradScaler("cpu")
        self.gen = torch.Generator().manual_seed(1)
        self.np_rng = np.random.default_rng(2)
        self.step = 7
        self.config = Config()
        self.models = [torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)]
        self.params = list(self.model.parameters())  # covered by model
        self.me = self
        self.thread = threading.Thread(target=lambda: None)
        self.lock = threading.Lock()
        self.callback = lambda: None
        self.file = file
        self.log = logging.getLogger("trainer")
        self.worker = FakeProcess()
        self.dataset = WithIds([1, 2, 3])  # a class of the harness
        self.module_class = torch.nn.Linear
        self.numpy = np


KEYS = ["config.lr", "ema_model", "gen", "model", "models.0", "models.1", "np_rng", "optimizer", "scaler",
        "scheduler", "step"]


@pytest.fixture
def trainer(tmp_path):
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch.amp.GradScaler is not available")
    with open(tmp_path / "log.txt", "w") as file:
        yield Trainer(file)


def digest(value):
    return st.combine(st.leaf_digests(value))


def test_a_trainer_s_components_are_found_by_attribute_path_and_nothing_else(trainer):
    found = state_of(trainer)
    assert list(found) == KEYS
    assert found["model"] is trainer.model and found["scaler"] is trainer.scaler
    assert found["config.lr"] == 0.01 and found["step"] == 7
    assert isinstance(found["np_rng"], dict) and found["np_rng"]["bit_generator"] == "PCG64"


def test_every_component_flattens_to_leaves_that_are_data_not_object_reprs(trainer):
    for name, value in state_of(trainer).items():
        leaves = dict(st.flatten(value))
        assert leaves, name
        for path, leaf in leaves.items():
            assert " at 0x" not in repr(leaf), f"{name}: {path} is an object, digested by its address"


def test_changing_the_ema_weights_changes_the_ema_component_and_only_it(trainer):
    before = {name: digest(value) for name, value in state_of(trainer).items()}
    with torch.no_grad():
        trainer.ema_model.weight.add_(1e-3)
    after = {name: digest(value) for name, value in state_of(trainer).items()}
    assert [name for name in before if before[name] != after[name]] == ["ema_model"]


def test_a_numpy_generator_is_a_snapshot_of_its_state_that_restores_it():
    holder = Config()
    holder.rng = np.random.default_rng(5)
    holder.legacy = np.random.RandomState(5)
    first = state_of(holder)
    snapshot = digest(first["rng"])
    drawn = holder.rng.random()
    holder.legacy.random_sample()
    second = state_of(holder)
    assert digest(first["rng"]) == snapshot  # a snapshot, not a live view
    assert digest(second["rng"]) != snapshot
    assert digest(second["legacy"]) != digest(first["legacy"])
    holder.rng.bit_generator.state = first["rng"]
    assert holder.rng.random() == drawn
    assert digest(state_of(holder)["rng"]) == digest(second["rng"])


def test_a_python_random_instance_is_its_state_as_bytes():
    holder = Config()
    holder.rng = random.Random(3)
    before = state_of(holder)["rng"]
    holder.rng.random()
    assert isinstance(before, bytes) and state_of(holder)["rng"] != before


def test_skip_leaves_out_a_path_and_everything_below_it_but_not_a_longer_name(trainer):
    found = state_of(trainer, skip=("ema_model", "config", "model"))
    # skip names paths: the skipped model's parameters, held under another path too, are reported there
    assert list(found) == ["gen", "models.0", "models.1", "np_rng", "optimizer", "params.0", "params.1", "scaler",
                           "scheduler", "step"]
    assert list(state_of(trainer, skip="ema_model")) == [key for key in KEYS if key != "ema_model"]


def test_max_depth_is_the_longest_path_walked():
    root = Config()
    root.a = Config()
    root.a.b = Config()
    root.a.b.c = {"d": torch.zeros(2)}
    assert list(state_of(root)) == ["a.b.c.d", "a.b.lr", "a.lr", "lr"]
    assert list(state_of(root, max_depth=4)) == ["a.b.c.d", "a.b.lr", "a.lr", "lr"]
    assert list(state_of(root, max_depth=3)) == ["a.b.lr", "a.lr", "lr"]
    assert list(state_of(root, max_depth=1)) == ["lr"]
    assert state_of(root, max_depth=0) == {}


def test_a_module_s_parameters_and_submodules_are_not_reported_again():
    holder = Config()
    holder.net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    holder.head = holder.net[1]  # sorts before net, still covered by it
    holder.grads = {"w": holder.net[0].weight}
    holder.frozen = torch.ones(1)  # a tensor of its own
    assert list(state_of(holder)) == ["frozen", "lr", "net"]


def test_an_object_reached_twice_is_reported_once_under_its_first_path():
    holder = Config()
    holder.model = torch.nn.Linear(1, 1)
    holder.models = [holder.model, torch.nn.Linear(1, 1)]
    holder.loop = [holder, {"back": holder}]
    assert list(state_of(holder)) == ["lr", "model", "models.1"]


def test_dict_keys_that_are_not_strings_are_named_by_str():
    holder = Config()
    holder.table = {2: 0.5, (1, 3): "x", 10: None}
    assert list(state_of(holder)) == ["lr", "table.(1, 3)", "table.10", "table.2"]


def test_slots_and_callable_objects_of_your_own_are_walked():
    class Slotted:
        __slots__ = ("count", "unset")

        def __init__(self):
            self.count = 4

    class Augment:
        def __init__(self):
            self.rng = torch.Generator().manual_seed(0)

        def __call__(self, x):
            return x

    holder = Config()
    holder.slotted = Slotted()
    holder.augment = Augment()
    holder._private = 1
    holder.__hidden = 2  # stored as _Config__hidden: private
    assert list(state_of(holder)) == ["_private", "augment.rng", "lr", "slotted.count"]
