"""A launched script's parameters named as its model names them (health/probe.py `find_model`):
the key in the state_dict of the outermost module the user built, the attributes of library
wrappers left out (DDP, torch.compile, activation checkpointing, FSDP1, Lightning); real modules
built here, then one real `distval launch` of a framework-shaped script."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

from distval.health.probe import find_model, layout_of


class Lit(nn.Module):
    """Shaped as a framework's model: the layers one attribute down, so `net` alone holds them all."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))


KEYS = ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]


def named(model: nn.Module, params: list[torch.Tensor] | None = None) -> tuple[nn.Module, list[str], str]:
    """What the probe names: (the module found, each of `params`' names, the layout)."""
    params = list(model.parameters()) if params is None else params
    found = find_model(params)
    return found.module, [found.names.get(id(p), "?") for p in params], layout_of(found, params)[0]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory):
    """A Gloo group of one rank in this process, for a real DDP."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_ddp_wrapped_framework_model_is_named_by_its_own_keys(group):
    lit = Lit()
    ddp = nn.parallel.DistributedDataParallel(lit)
    module, names, layout = named(ddp)
    assert module is lit and names == KEYS == list(lit.state_dict()) and layout == "ddp"
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))  # examples/ddp_health.py's model
    assert named(nn.parallel.DistributedDataParallel(plain))[1:] == ([k[4:] for k in KEYS], "ddp")


def test_a_lightning_wrapper_inside_ddp_is_left_out(group):
    """DDP(Lightning's `_LightningModuleWrapperBase(LitModel)`): the LitModel's keys."""
    wrapper_cls = type("_LightningModuleWrapperBase", (nn.Module,), {"__module__": "lightning.pytorch.overrides.base"})
    lit, wrapper = Lit(), wrapper_cls()
    wrapper._forward_module = lit
    module, names, layout = named(nn.parallel.DistributedDataParallel(wrapper))
    assert module is lit and names == KEYS and layout == "ddp"


def test_a_fabric_module_holding_its_module_twice_is_left_out():
    """Fabric's `_FabricModule` holds the module as `_forward_module` and `_original_module`."""
    fabric_cls = type("_FabricModule", (nn.Module,), {"__module__": "lightning.fabric.wrappers"})
    lit, fabric = Lit(), fabric_cls()
    fabric._forward_module, fabric._original_module = lit, lit
    module, names, layout = named(fabric)
    assert module is lit and names == KEYS and layout == "plain"


def test_the_outermost_module_the_user_built_names_the_parameters():
    """A GAN-shaped container: the first optimizer holds the generator's parameters; the
    container's keys name them, as its state_dict does."""
    class Gan(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.generator, self.discriminator = Lit(), Lit()

    gan = Gan()
    module, names, _ = named(gan, list(gan.generator.parameters()))
    assert module is gan and names == [f"generator.{k}" for k in KEYS]


def test_a_library_class_the_user_built_is_no_wrapper():
    """nn.Sequential(Lit()) keeps its `0.`; FSDP2's `fully_shard` turns a user's class into one
    made in torch.distributed (`FSDPLit`, derived from Lit), still the user's."""
    outer = nn.Sequential(Lit())
    assert named(outer)[1] == [f"0.{k}" for k in KEYS]
    from torch.distributed.fsdp import FSDPModule

    lit = Lit()
    lit.__class__ = type("FSDPLit", (FSDPModule, Lit), {"__module__": "torch.distributed.fsdp._fully_shard._fsdp_init"})
    assert named(lit) == (lit, KEYS, "plain")


def test_a_discarded_container_is_not_the_model():
    """A container left in a reference cycle is garbage the gc still lists: it must not win."""
    lit = Lit()
    temporary = nn.Sequential(lit)
    temporary.me = [temporary]  # a cycle: freed only by the collector
    del temporary
    assert named(lit)[:2] == (lit, KEYS)


def test_a_checkpointed_block_is_named_as_its_state_dict_names_it():
    """torch strips `_checkpoint_wrapped_module.` from a state_dict itself: the names agree."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    lit = Lit()
    lit.net[0] = checkpoint_wrapper(lit.net[0])
    assert "net.0._checkpoint_wrapped_module.weight" in dict(lit.named_parameters())
    assert named(lit)[1] == KEYS == list(lit.state_dict())


def test_a_compiled_model_and_a_compiled_block_are_named_without_orig_mod():
    started = time.monotonic()
    lit = Lit()
    compiled = torch.compile(lit)  # wrapped only, never run: no compilation
    if time.monotonic() - started > 20:
        pytest.skip("importing torch._dynamo took over 20 s here")
    assert named(compiled)[:2] == (lit, KEYS)
    lit.net[2] = torch.compile(lit.net[2])
    assert "net.2._orig_mod.weight" in dict(lit.named_parameters())
    assert named(lit)[1] == KEYS


def test_an_fsdp1_flat_parameter_is_named_by_the_keys_it_holds():
    """FSDP1 (use_orig_params=False) puts the wrapped module's parameters in one flat parameter on
    it (`_fsdp_wrapped_module._flat_param`); its `_fqns` are their keys. FSDP1 needs an accelerator,
    so its shape is built by hand with torch's own FlatParameter."""
    from torch.distributed.fsdp._flat_param import FlatParameter

    fsdp_cls = type("FullyShardedDataParallel", (nn.Module,),
                    {"__module__": "torch.distributed.fsdp.fully_sharded_data_parallel"})
    inner, outer = nn.Module(), fsdp_cls()
    inner._flat_param = FlatParameter(torch.zeros(8))
    inner._flat_param._fqns = ("net.0.weight", "net.0.bias", "net.2.weight")
    outer._fsdp_wrapped_module = inner
    module, names, layout = named(outer)
    assert module is inner and names == ["net.0.weight .. net.2.weight"] and layout == "sharded"


def test_a_ddp_over_part_of_the_optimizers_parameters_is_no_replica_guarantee(group):
    lit, head = Lit(), nn.Linear(1, 1)
    ddp = nn.parallel.DistributedDataParallel(lit)
    params = list(lit.parameters()) + list(head.parameters())
    module, names, layout = named(ddp, params)
    assert module is lit and names == KEYS + ["?", "?"] and layout == "plain"


SCRIPT = """
import sys
import torch
import torch.distributed as dist
from torch import nn

class Lit(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.net(x)

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
lit = Lit()
model = nn.parallel.DistributedDataParallel(lit)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    def closure():
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        if rank == 1 and step == 12:
            lit.net[0].weight.grad[0, 0] = float("nan")
        return loss
    opt.step(closure)
dist.destroy_process_group()
"""


def test_a_launched_framework_shaped_script_names_the_nan_by_the_models_key(tmp_path):
    """DDP over a Lit whose layers sit under `net`, stepped through a closure: rank 1's NaN
    gradient at step 12 is `net.0.weight`, as the model's state_dict says (not `0.weight`)."""
    (tmp_path / "lit.py").write_text(SCRIPT)
    out = tmp_path / "out.json"
    res = subprocess.run([sys.executable, "-m", "distval", "launch", "--nproc", "2", "--check-nan-every", "1",
                          "--json", str(out), str(tmp_path / "lit.py"), "40"],
                         capture_output=True, text=True, timeout=120)
    check = {c["name"]: c for c in json.loads(out.read_text())["checks"]}["health numerics"]
    assert res.returncode == 1 and check["status"] == "FAIL", (check, res.stderr[-2000:])
    assert check["where"] == {"rank": 1, "step": 12} and check["details"]["parameter"] == "net.0.weight", check
