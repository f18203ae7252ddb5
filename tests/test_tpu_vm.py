"""The Trainer's TPU VM slice (components.tpu_vm) against the rehearsal Cloud TPU API on 127.0.0.1 (the real
google-cloud-tpu client over REST): created, followed, recreated when preempted, deleted whatever happens.

The slices' hosts run a stand-in startup script here (bash: it reports its set-up and, on worker 0, logs
training steps as the trainer does and reports the trainer's exit); the real script, the wheel and the trainer
run in the rehearsal of the whole pipeline (tests/test_pipeline.py).
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from components import tpu_vm
from pipeline import rehearsal_tpu_api

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Worker 0 logs steps 1..STEPS (0.2 s apart) into the run log, as the trainer's recorder does, then reports
# its exit; a later attempt (the slice recreated) logs that it resumed from the last step logged.
STAND_IN = r"""#!/bin/bash
ATTEMPT_DIR='{attempt_dir}'
STATUS_DIR="$(dirname "$(dirname "$ATTEMPT_DIR")")"
mkdir -p "$ATTEMPT_DIR"
echo "{\"worker\": $EFFNET_TPU_WORKER, \"setup\": \"done\"}" > "$ATTEMPT_DIR/worker-$EFFNET_TPU_WORKER.json"
[ "$EFFNET_TPU_WORKER" = 0 ] || exit 0
first=1
if [ -f "$STATUS_DIR/run_log.jsonl" ]; then
  first=$(( $(grep -c progress "$STATUS_DIR/run_log.jsonl") + 1 ))
  echo "{\"event\": \"start\", \"step\": $((first - 1)), \"resumed\": true}" >> "$STATUS_DIR/run_log.jsonl"
fi
for step in $(seq $first STEPS); do
  sleep 0.2
  echo "{\"event\": \"progress\", \"step\": $step, \"total_steps\": STEPS, \"epoch\": $step, \"eta\": \"1s\"}" >> "$STATUS_DIR/run_log.jsonl"
done
echo '{"exit_code": EXIT, "last_line": "LAST"}' > "$ATTEMPT_DIR/trainer.json"
"""


def stand_in(steps: int = 3, exit_code: int = 0, last: str = "") -> str:
    return STAND_IN.replace("STEPS", str(steps)).replace("EXIT", str(exit_code)).replace("LAST", last)


def _request(api, tmp_path, script: str, **fields) -> tpu_vm.SliceRequest:
    settings = dict(
        project="effnet-test-project",
        zone="us-central2-b",
        accelerator="tpu-v4-32",
        image="unused-by-the-stand-in",
        tier="spot",
        max_wait_seconds=60,
        labels={"effnet-run": "run-1", "effnet_task": "trainer"},
        api_endpoint=api.endpoint,
    )
    settings.update(fields)
    return tpu_vm.SliceRequest(
        settings=tpu_vm.SliceSettings(**settings),
        name="effnet-0123456789abcdef0123",
        status_dir=str(tmp_path / "model_run"),
        startup_script=script,
        runtime_version="tpu-vm-tf-2.16.1-pod-pjrt",
    )


@pytest.fixture
def api(tmp_path):
    with rehearsal_tpu_api.RehearsalTpuApi(str(tmp_path / "hosts")) as rehearsal:
        yield rehearsal


def _created(api) -> list[str]:
    return [r["query"]["queuedResourceId"][0] for r in api.calls("POST", "/queuedResources")]


def test_a_slice_is_queued_with_its_tier_runtime_and_labels_set_up_on_every_host_and_deleted(api, tmp_path):
    request = _request(api, tmp_path, stand_in())
    tpu_vm.run_slice(request, poll_seconds=0.1)
    (created,) = api.calls("POST", "/queuedResources")
    assert created["query"]["queuedResourceId"] == ["effnet-0123456789abcdef0123-0"]
    body = created["body"]
    node = body["tpu"]["nodeSpec"][0]["node"]
    assert body["spot"] == {} and body["queueingPolicy"] == {"validUntilDuration": "60s"}
    assert (node["acceleratorType"], node["runtimeVersion"]) == ("v4-32", "tpu-vm-tf-2.16.1-pod-pjrt")
    assert node["labels"] == {"effnet-run": "run-1", "effnet_task": "trainer"}
    assert (
        "ATTEMPT_DIR='" + str(tmp_path / "model_run" / "slice" / "effnet-0123456789abcdef0123-0")
        in (node["metadata"]["startup-script"])
    )
    attempt = tmp_path / "model_run" / "slice" / "effnet-0123456789abcdef0123-0"
    assert sorted(os.listdir(attempt)) == ["trainer.json", *(f"worker-{n}.json" for n in range(4))]  # 4 hosts
    assert api.calls("DELETE") and api.calls("DELETE")[0]["query"]["force"] == ["true"]
    assert api.slices() == {}


@pytest.mark.slow  # two slices of host processes, a trainer each: 10-16 s
def test_a_preempted_slice_is_created_again_and_the_training_resumes(tmp_path):
    scenario = rehearsal_tpu_api.Scenario(preempt_at_step=3, preempt_delay_seconds=0)
    with rehearsal_tpu_api.RehearsalTpuApi(str(tmp_path / "hosts"), scenario) as api:
        tpu_vm.run_slice(_request(api, tmp_path, stand_in(steps=12)), poll_seconds=0.1)
        assert api.preemptions == 1
        assert _created(api) == ["effnet-0123456789abcdef0123-0", "effnet-0123456789abcdef0123-1"]
        assert api.slices() == {}
    events = [
        json.loads(line) for line in (tmp_path / "model_run" / "run_log.jsonl").read_text().splitlines()
    ]
    (start,) = [e for e in events if e["event"] == "start"]
    assert start["resumed"] and start["step"] >= 3
    assert [e["step"] for e in events if e["event"] == "progress"] == list(range(1, 13))


def test_a_slice_lost_more_often_than_allowed_fails_in_one_line_and_nothing_is_left(tmp_path):
    scenario = rehearsal_tpu_api.Scenario(preempt_at_step=2, preempt_delay_seconds=0)
    with rehearsal_tpu_api.RehearsalTpuApi(str(tmp_path / "hosts"), scenario) as api:
        request = _request(api, tmp_path, stand_in(steps=30), max_recreations=0)
        with pytest.raises(
            tpu_vm.SliceFailed, match=r"^tpu-v4-32 in us-central2-b was lost 1 times"
        ) as failed:
            tpu_vm.run_slice(request, poll_seconds=0.1)
        assert "\n" not in str(failed.value) and "run the step again" in str(failed.value)
        assert api.slices() == {}


def test_a_slice_never_provisioned_ends_in_one_line_naming_accelerator_zone_and_the_apis_reason(tmp_path):
    scenario = rehearsal_tpu_api.Scenario(never_provision=True)
    with rehearsal_tpu_api.RehearsalTpuApi(str(tmp_path / "hosts"), scenario) as api:
        request = _request(api, tmp_path, stand_in(), max_wait_seconds=1, zone="us-central2-b")
        with pytest.raises(tpu_vm.SliceFailed) as failed:
            tpu_vm.run_slice(request, poll_seconds=0.2)
        message = str(failed.value)
        assert message.startswith("tpu-v4-32 in us-central2-b could not be had: the queued resource failed: ")
        assert "There is no more capacity in the zone us-central2-b" in message and "\n" not in message
        assert api.slices() == {}


@pytest.mark.slow  # host processes through injected faults: about 11 s
def test_the_apis_faults_are_waited_out_and_a_create_whose_answer_was_lost_makes_one_slice(tmp_path):
    faults = {
        "create_queued_resource": ["503", "lost"],
        "get_queued_resource": ["503", "429"],
        "get_node": ["503"],
    }
    scenario = rehearsal_tpu_api.Scenario(faults=faults)
    with rehearsal_tpu_api.RehearsalTpuApi(str(tmp_path / "hosts"), scenario) as api:
        tpu_vm.run_slice(_request(api, tmp_path, stand_in()), poll_seconds=0.1)
        # The 503 made nothing; the lost answer's create made the slice, which the retry met (409) and took.
        posts = api.calls("POST", "/queuedResources")
        assert len(posts) == 3 and set(_created(api)) == {"effnet-0123456789abcdef0123-0"}
        assert api.slices() == {} and not any(faults.values())


def test_a_trainer_that_fails_ends_the_step_with_its_last_line_and_the_slice_is_deleted(api, tmp_path):
    request = _request(api, tmp_path, stand_in(exit_code=1, last="ValueError: data.global_batch_size=7 ..."))
    with pytest.raises(tpu_vm.SliceFailed, match=r"exited 1: ValueError: data.global_batch_size=7 \.\.\.$"):
        tpu_vm.run_slice(request, poll_seconds=0.1)
    assert api.slices() == {}


RUN_SLICE = """
import sys
from components import tpu_vm
request = tpu_vm.SliceRequest.from_json(sys.argv[1])
try:
    tpu_vm.run_slice(request, poll_seconds=0.1)
except Exception as error:
    print(type(error).__name__, error)
    sys.exit(1)
"""


def _start(request) -> subprocess.Popen:
    values = request.to_json()
    return subprocess.Popen(
        [sys.executable, "-c", RUN_SLICE, values], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _wait_active(api, seconds: float = 120) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        active = [name for name, state in api.slices().items() if state == "ACTIVE"]
        if active:
            return active[0]
        time.sleep(0.1)
    raise AssertionError(f"no slice became active: {api.slices()}")


@pytest.mark.slow
def test_sigterm_deletes_the_slice_and_a_step_killed_mid_run_is_reattached_by_its_retry(api, tmp_path):
    """SIGTERM to a step whose slice trains: the slice is deleted before it exits. A step killed outright
    (SIGKILL: no chance to delete) leaves its slice; the retried step finds it by its name and follows it, and
    creates no second one."""
    request = _request(api, tmp_path, stand_in(steps=100_000))
    step = _start(request)
    _wait_active(api)
    step.send_signal(signal.SIGTERM)
    out, err = step.communicate(timeout=120)
    assert step.returncode == 1, err[-2000:]
    assert out.splitlines()[-1] == "TaskStopped the pipeline task received SIGTERM", out
    assert api.slices() == {}

    retried = dataclasses_replace(
        request, name="effnet-fedcba9876543210fedc", startup_script=stand_in(steps=30)
    )
    step = _start(retried)
    active = _wait_active(api)
    step.kill()
    step.wait()
    assert api.slices() == {active: "ACTIVE"}  # left running by the killed step
    tpu_vm.run_slice(retried, poll_seconds=0.1)  # the retry
    assert _created(api).count("effnet-fedcba9876543210fedc-0") == 1
    assert api.slices() == {}


# A command of this project's own (the local runner with --rehearse-slice) that trained on a slice and goes on
# to its next step (the Evaluator) when Ctrl-C comes.
TRAINED_THEN_NEXT_STEP = """
import sys, time
from components import tpu_vm
from effnet_common import console, stopping
request = tpu_vm.SliceRequest.from_json(sys.argv[1])
with console.session(), stopping.describe("the Trainer's slice is deleted; run the same command again"):
    tpu_vm.run_slice(request, poll_seconds=0.1)
    print("trained: the next step starts", flush=True)
    time.sleep(120)
print("not stopped", flush=True)
"""


def test_ctrl_c_after_a_trained_slice_stops_the_command_in_one_line(api, tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) after the slice's training ended and its
    slice was deleted: the command stops at once in one line, exit 130, as it would before the step."""
    request = _request(api, tmp_path, stand_in(steps=3))
    command = [sys.executable, "-c", TRAINED_THEN_NEXT_STEP, request.to_json()]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        for line in process.stdout:
            if line.startswith("trained"):
                break
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, out + err
    assert "not stopped" not in out
    assert err.strip().splitlines() == [
        "stopped by the user: the Trainer's slice is deleted; run the same command again"
    ], err
    assert api.slices() == {}


def dataclasses_replace(request, **changes):
    import dataclasses

    return dataclasses.replace(request, **changes)


def test_the_queued_resources_of_a_run_are_found_by_the_label_on_their_node(api, tmp_path):
    client = tpu_vm.client_for(api.endpoint)
    mine = _request(api, tmp_path, textwrap.dedent("#!/bin/bash\nsleep 60\n"))
    other = dataclasses_replace(
        mine, name="effnet-other", settings=dataclasses_replace(mine.settings, labels={"effnet-run": "run-2"})
    )
    for request in (mine, other):
        tpu_vm.create(client, request, 0)
    found = tpu_vm.run_resources(client, "effnet-test-project", "us-central2-b", "effnet-run", "run-1")
    assert found == [mine.queued_resource_name(0)]
    for name in (mine.queued_resource_name(0), other.queued_resource_name(0)):
        assert tpu_vm.delete(client, name, wait_seconds=30, poll_seconds=0.1)
