"""`rase serve --ray` options, and Ray staying out of everything else."""
import subprocess
import sys

import pytest

from rase import cli
from rase.errors import InvalidRequest
from rase.integrations.replicas import Replicas


def test_rase_never_imports_ray_unless_asked():
    code = ("import sys, rase, rase.api, rase.cli, rase.server, rase.integrations, rase.integrations.route_key, "
            "rase.integrations.asgi_call, rase.integrations.node_store; "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_replica_counts_and_ranges():
    assert Replicas.parse("3") == Replicas(3) and Replicas(3).options(8) == {"num_replicas": 3}
    auto = Replicas.parse("1:4")
    assert auto.options(8) == {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4,
                                                      "target_ongoing_requests": 8}}
    assert auto.describe() == "1 to 4 rase replicas"
    for bad in ("0", "-1", "two", "3:1", "1:", ":2", "1:2:3"):
        with pytest.raises(InvalidRequest, match="--replicas"):
            Replicas.parse(bad)


@pytest.mark.parametrize("flags", [["--replicas", "2"], ["--ray-address", "auto"], ["--router", "pow2"],
                                   ["--drain-timeout", "5"], ["--model", "m"]])
def test_ray_options_without_ray_are_refused_by_name(flags, capsys, tmp_path):
    assert cli.main(["--store", str(tmp_path), "serve", *flags]) == 1
    assert f"{flags[0]} only apply with --ray" in capsys.readouterr().err


def test_without_the_extra_ray_says_what_to_install(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: find_spec says None
    assert cli.main(["--store", str(tmp_path), "serve", "--ray"]) == 1
    assert "pip install 'rase[ray]'" in capsys.readouterr().err


@pytest.mark.needs_model
def test_a_port_in_use_is_refused_before_ray_starts(smollm2_store, capsys, monkeypatch):
    import socket

    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)  # serve_on_ray sets it; restored after
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["--store", str(smollm2_store), "serve", "--ray", "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()  # refused before any Ray process started


@pytest.mark.needs_model
def test_a_store_without_the_models_is_refused_before_ray_starts(smollm2_store, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    assert cli.main(["--store", str(tmp_path), "serve", "--ray"]) == 1
    assert "holds no models: rase model pull/import one first" in capsys.readouterr().err
    assert cli.main(["--store", str(smollm2_store), "serve", "--ray", "--model", "nope"]) == 1
    assert "nope" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()
