"""openpi's own example clients against our policy server (real_robot/openpi_layouts.py): a real server on
localhost, driven by openpi-client's ``WebsocketClientPolicy`` with the exact request dicts of openpi's
LIBERO, DROID and ALOHA examples; a layout that does not fit the policy, or no known layout, gets an error
naming the keys it takes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import SERVED_TINY as TINY
from openpi_client import image_tools
from openpi_client.websocket_client_policy import WebsocketClientPolicy

import policies
from real_robot.openpi_layouts import LAYOUTS, LayoutError, fit_image, recognize
from real_robot.server import PolicyServer, ServerThread
from real_robot.spec import PolicySpec, RequestError

H = 4
#: each embodiment's policy (its own camera names) and the openpi layout that fits it
LIBERO = dict(state_dim=8, action_dim=7, cameras=["agentview", "wrist"])
DROID = dict(state_dim=8, action_dim=8, cameras=["exterior", "wrist"])
ALOHA = dict(state_dim=14, action_dim=14, cameras=["cam_high", "cam_left_wrist", "cam_right_wrist"])


def _policy(**kwargs):
    torch.manual_seed(0)
    return policies.make("flow", chunk_size=H, **TINY, **kwargs)


def _spec(**kwargs) -> PolicySpec:
    return PolicySpec.from_policy(_policy(**kwargs))


def _frame(value: int, h: int = 256, w: int = 256) -> np.ndarray:
    return np.full((h, w, 3), value, np.uint8)


def libero_request() -> dict:
    """What openpi's examples/libero/main.py sends (its preprocessing: 180-degree turn, resize_with_pad 224)."""
    img = np.ascontiguousarray(_frame(10)[::-1, ::-1])
    wrist = np.ascontiguousarray(_frame(200)[::-1, ::-1])
    return {
        "observation/image": image_tools.convert_to_uint8(image_tools.resize_with_pad(img, 224, 224)),
        "observation/wrist_image": image_tools.convert_to_uint8(image_tools.resize_with_pad(wrist, 224, 224)),
        "observation/state": np.concatenate((np.array([0.1, 0.0, 1.0]), np.zeros(3), np.array([0.04, -0.04]))),
        "prompt": "pick up the black bowl and place it on the plate",
    }


def droid_request() -> dict:
    """What openpi's examples/droid/main.py sends (camera frames 1280x720, resize_with_pad 224)."""
    return {
        "observation/exterior_image_1_left": image_tools.resize_with_pad(_frame(10, 720, 1280), 224, 224),
        "observation/wrist_image_left": image_tools.resize_with_pad(_frame(200, 720, 1280), 224, 224),
        "observation/joint_position": np.zeros(7),
        "observation/gripper_position": np.array([0.5]),
        "prompt": "put the marker in the cup",
    }


def aloha_request() -> dict:
    """What openpi's examples/aloha_real/env.py returns to its runtime: [3, 224, 224] images, no prompt."""
    chw = lambda v: np.ascontiguousarray(_frame(v, 224, 224).transpose(2, 0, 1))  # noqa: E731
    cams = {"cam_high": chw(10), "cam_low": chw(50), "cam_left_wrist": chw(200), "cam_right_wrist": chw(250)}
    return {"state": np.zeros(14), "images": cams}


@pytest.fixture(scope="module")
def libero_server():
    with ServerThread(PolicyServer(_policy(**LIBERO))) as port:
        yield port


def test_openpi_libero_client_gets_actions_unchanged(libero_server):
    client = WebsocketClientPolicy("127.0.0.1", libero_server)
    meta = client.get_server_metadata()
    assert meta["request_aliases"]["libero"]["cameras"] == {
        "agentview": "observation/image",
        "wrist": "observation/wrist_image",
    }
    assert set(meta["request_aliases"]) == {"libero"}
    for _ in range(2):  # the connection serves one request after another
        actions = client.infer(libero_request())["actions"]
        assert actions.shape == (H, 7) and np.isfinite(actions).all() and np.abs(actions).max() <= 1.0


def test_libero_alias_is_the_policys_own_request():
    """Each image lands on its camera, resized to the policy's size; the float64 state is cast."""
    spec = _spec(**LIBERO)
    got = spec.validate(libero_request())
    assert got["rgb"].shape == (2, 32, 32, 3) and got["state"].dtype == np.float32
    assert (got["rgb"][0] == 10).all() and (got["rgb"][1] == 200).all()
    own = spec.validate(
        {
            "observation/images/agentview": _frame(10, 32, 32),
            "observation/images/wrist": _frame(200, 32, 32),
            "observation/state": libero_request()["observation/state"],
            "prompt": libero_request()["prompt"],
        }
    )
    for key in ("rgb", "state"):
        np.testing.assert_array_equal(got[key], own[key])


def test_openpi_droid_client_gets_actions_from_a_droid_policy():
    with ServerThread(PolicyServer(_policy(**DROID))) as port:
        client = WebsocketClientPolicy("127.0.0.1", port)
        assert set(client.get_server_metadata()["request_aliases"]) == {"droid"}
        actions = client.infer(droid_request())["actions"]
        assert actions.shape == (H, 8) and np.isfinite(actions).all()
    got = _spec(**DROID).validate(droid_request())
    assert (got["rgb"][0][16] == 10).all() and (got["rgb"][1][16] == 200).all()  # padded rows stay black
    assert (got["rgb"][0][0] == 0).all() and got["state"].tolist() == [0.0] * 7 + [0.5]


def test_openpi_aloha_client_without_a_prompt_gets_the_default_prompt():
    with ServerThread(PolicyServer(_policy(**ALOHA), default_prompt="transfer the cube")) as port:
        client = WebsocketClientPolicy("127.0.0.1", port)
        meta = client.get_server_metadata()
        assert meta["default_prompt"] == "transfer the cube"
        assert meta["request_aliases"]["aloha"]["cameras"]["cam_left_wrist"] == 'images["cam_left_wrist"]'
        actions = client.infer(aloha_request())["actions"]
        assert actions.shape == (H, 14) and np.isfinite(actions).all()
    got = _spec(**ALOHA).validate({**aloha_request(), "prompt": "transfer the cube"})
    assert [int(v[0, 0, 0]) for v in got["rgb"]] == [10, 200, 250]  # by name; cam_low is not read
    with pytest.raises(RequestError, match=r"missing \['prompt'\].*default_prompt"):
        _spec(**ALOHA).validate(aloha_request())
    own = {
        "observation/state": np.zeros(14),
        **{f"observation/images/{c}": _frame(0, 32, 32) for c in ALOHA["cameras"]},
    }
    assert replace(_spec(**ALOHA), default_prompt="fold").validate(own)["prompt"] == "fold"  # our own keys too


def test_a_layout_of_another_embodiment_gets_a_clear_error(libero_server):
    client = WebsocketClientPolicy("127.0.0.1", libero_server)
    with pytest.raises(RuntimeError) as err:
        client.infer(droid_request())
    message = str(err.value)
    assert "follows openpi's droid layout" in message and "actions [H, 8]" in message
    assert "observation/images/agentview" in message and "or openpi's libero layout" in message
    with pytest.raises(RuntimeError, match="request keys do not match the policy") as err:
        client.infer({"observation/top_image": _frame(0, 32, 32), "prompt": "x"})
    assert "or openpi's libero layout ['observation/image'" in str(err.value)
    assert client.infer(libero_request())["actions"].shape == (H, 7)  # the connection is still usable


def test_a_policy_of_no_openpi_embodiment_takes_no_alias():
    spec = _spec()  # our suites' 15-D state
    assert spec.metadata()["request_aliases"] == {}
    with pytest.raises(RequestError, match=r"openpi's libero layout .* state \[8\].*state \[15\]") as err:
        spec.validate(libero_request())
    assert "libero, droid, aloha layouts do not fit this policy" in str(err.value)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: {**r, "observation/state": np.zeros(7)}, r"observation/state must be a float32/float64 array \[8\]"),
        (lambda r: {**r, "observation/image": np.zeros((224, 224), np.uint8)}, "observation/image must be a uint8"),
        (lambda r: {**r, "observation/image": np.zeros((4, 4, 3), np.uint8)}, "observation/image is 4x4"),
        (lambda r: {**r, "extra": 1}, r"unknown \['extra'\]"),
        (lambda r: {k: v for k, v in r.items() if k != "observation/wrist_image"}, "missing"),
    ],
)
def test_malformed_values_in_a_layout_are_refused(change, message):
    with pytest.raises(RequestError, match=message):
        _spec(**LIBERO).validate(change(libero_request()))


def test_unknown_aloha_cameras_are_refused():
    request = aloha_request()
    request["images"]["cam_side"] = request["images"]["cam_low"]
    with pytest.raises(RequestError, match=r"unknown ALOHA camera\(s\) \['cam_side'\]"):
        _spec(**ALOHA).validate({**request, "prompt": "x"})


def test_cameras_fit_by_name_then_by_role():
    libero = LAYOUTS["libero"]
    fit = libero.fit(["wrist_image", "image"], 8, 7, "proprio")  # LeRobot's LIBERO checkpoints' names
    assert {c: s.label for c, s in fit.cameras} == {
        "wrist_image": "observation/wrist_image",
        "image": "observation/image",
    }
    with pytest.raises(LayoutError, match="need one base image more"):
        libero.fit(["front", "side"], 8, 7, "proprio")
    with pytest.raises(LayoutError, match="privileged"):
        libero.fit(["agentview"], 8, 7, "privileged")
    one = LAYOUTS["aloha"].fit(["top"], 14, 14, "proprio")
    assert one.cameras[0][1].label == 'images["cam_high"]'


def test_fit_image_pads_to_a_square_then_resizes():
    wide = np.full((20, 40, 3), 255, np.uint8)
    out = fit_image(wide, 20, (16, 1024))
    assert out.shape == (20, 20, 3) and out.dtype == np.uint8
    assert (out[:4] == 0).all() and (out[-4:] == 0).all() and (out[8:12] == 255).all()
    same = _frame(3, 20, 20)
    assert fit_image(same, 20, (16, 1024)) is same


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_registered_layout_feeds_a_policy_of_its_embodiment(name):
    """The registry's contract: each layout is recognised from its own keys and, for a policy named after its
    cameras, gives that policy's input."""
    layout = LAYOUTS[name]
    assert recognize(set(layout.keys())) is layout
    cameras = [slot.name for slot in layout.images]
    spec = PolicySpec(
        family="flow",
        action_dim=layout.action_dim,
        chunk_size=H,
        state_dim=layout.state_dim,
        cameras=tuple(cameras),
        image_size=32,
        control_hz=20.0,
    )
    assert set(spec.metadata()["request_aliases"]) == {name}
    request: dict = {"prompt": "x"}
    for i, slot in enumerate(layout.images):
        node = request
        for part in slot.path[:-1]:
            node = node.setdefault(part, {})
        node[slot.path[-1]] = np.full((48, 48, 3), 10 * i, np.uint8)
    for key, dim in layout.state:
        request[key] = np.ones(dim)
    got = spec.validate(request)
    assert got["rgb"].shape == (len(cameras), 32, 32, 3) and got["state"].shape == (layout.state_dim,)
    assert [int(v[0, 0, 0]) for v in got["rgb"]] == [10 * i for i in range(len(cameras))]
