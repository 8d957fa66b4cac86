"""The dashboard end to end in Debian's Chromium (Playwright), against a real pod that trains for real: root's
pod with its default sandbox, as users run it (every job walled in, the pod's home hidden from it).

DIGITS' three buttons and what follows them: sign in, pick Fashion-MNIST, pick the convnet, start a
short CPU training, watch its chart gain points live, see it finish, deploy it, upload a test image and
get a prediction; compare two runs; cancel from the page; a second user sees nothing of the first's;
anonymous visitors go to sign-in; a form posted without its CSRF token is refused; markup in a log line
and in a typed value stays text. Screenshots of every page go to ``DESKPOD_SCREENSHOTS`` when it is set
(``docs/dashboard/`` for the README), else to the test's temporary folder.

Needs ``/usr/bin/chromium`` (``make test`` installs Debian's package); without it this test fails,
unless ``DESKPOD_NO_BROWSER=1`` says to skip it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deskpod.hardware.placement import local_topology
from deskpod.plan.local import Measurements, fit_local, save
from tests.jobs.pods import Pod, Pods, python_job, wait_state
from tests.web.browser import CHROMIUM, launch_chromium, new_user

# This box as `deskpod plan calibrate` measured it (docs/benchmarks.md, "deskpod plan calibrate on this box",
# run 1): a recorded real measurement, so the New training page shows a predicted time.
RECORDED = {"kind": "cpu", "devices": 2, "cores": 2, "peak_tflops": 0.1077, "memory_bandwidth_gbs": 53.0,
            "model": "resnet18", "batch": 8, "shape": (3, 112, 112), "images_per_s": 68.2, "comm_busbw_gbs": 1.76}  # fmt: skip

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("DESKPOD_NO_BROWSER") == "1":
            pytest.skip("DESKPOD_NO_BROWSER=1: the browser tests are skipped on purpose")
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium for these tests")
    pods = Pods(tmp_path_factory.mktemp("e2e"))
    started = pods(sandbox=True)  # as users run it: root's pod, every job in its sandbox
    topology = local_topology()
    if topology.device_count == RECORDED["devices"]:
        save(fit_local(Measurements(**RECORDED), topology), started.home)  # type: ignore[arg-type]
    yield started
    pods.stop_all()


@pytest.fixture(scope="module")
def browser(pod: Pod) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = os.environ.get("DESKPOD_SCREENSHOTS")
    folder = Path(where) if where else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def signed_in(browser: Any, pod: Pod, token: str, *, dark: bool = False) -> Any:
    """A new browser context (its own cookies) signed in through the sign-in page.

    ``bypass_csp``: the test's own probes (``wait_for_function``, ``evaluate``) are scripts the page's
    Content-Security-Policy would refuse; without the policy, markup that escaped escaping would run
    too, so the escaping checks below do not lean on the policy."""
    ctx = browser.new_context(
        viewport={"width": 1280, "height": 900}, color_scheme="dark" if dark else "light", bypass_csp=True
    )
    page = ctx.new_page()
    page.goto(f"{pod.url}/ui/jobs")
    assert "/ui/login?next=/ui/jobs" in page.url  # anonymous: to sign-in first
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{pod.url}/ui/jobs")  # ... then back to the page it asked for
    return page


def job_id_of(url: str) -> str:
    m = re.search(r"/ui/jobs/(\d+)$", url)
    assert m, url
    return m.group(1)


def test_three_clicks_to_a_trained_served_model(browser: Any, pod: Pod, shots: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    alice = new_user(pod, "alice")
    api = pod.client(alice)
    login = browser.new_page()
    login.goto(f"{pod.url}/ui/")
    login.screenshot(path=str(shots / "login.png"))
    login.close()
    page = signed_in(browser, pod, alice)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    # 1 dataset -> 2 network -> 3 train
    page.get_by_role("link", name="New training").click()
    page.get_by_role("link", name="Fashion-MNIST").click()
    expect(page.get_by_text("T-shirt/top").first).to_be_visible()
    page.wait_for_load_state("networkidle")  # the sample grid has loaded
    page.screenshot(path=str(shots / "new-1-dataset.png"), full_page=True)
    page.get_by_role("link", name="convnet").click()
    page.screenshot(path=str(shots / "new-2-network.png"), full_page=True)
    page.get_by_label("Steps").fill("120")
    page.get_by_label("Batch size per device").fill("64")
    expect(page.get_by_text("deskpod train --submit")).to_contain_text("--steps 120")
    if local_topology().device_count == RECORDED["devices"]:
        expect(page.get_by_text("Time to train")).to_be_visible()
    page.screenshot(path=str(shots / "new-3-train.png"), full_page=True)
    page.get_by_role("button", name="Start training").click()
    page.wait_for_url(re.compile(r".*/ui/jobs/\d+$"))
    first = job_id_of(page.url)

    # the chart gains points while it trains, and the page sees it finish, without a reload
    chart = page.locator("#chart-loss")
    page.wait_for_function("document.querySelector('#chart-loss').dataset.points > 0", timeout=180_000)
    seen = int(chart.get_attribute("data-points") or 0)
    page.wait_for_function(f"document.querySelector('#chart-loss').dataset.points > {seen}", timeout=180_000)
    other = page.context.new_page()  # the Pod page while the job holds the devices
    other.goto(f"{pod.url}/ui/")
    expect(other.get_by_text(f"job {first}").first).to_be_visible()
    other.screenshot(path=str(shots / "pod.png"), full_page=True)
    for i in range(2):  # two jobs waiting behind it: the Jobs page shows their place and the run's progress
        api.submit({"name": f"sweep-{i}", "command": ["sleep", "1"], "devices": "all", "max_runtime": 60})
    other.goto(f"{pod.url}/ui/jobs")
    expect(other.get_by_text("#2 in queue")).to_be_visible()
    other.screenshot(path=str(shots / "jobs.png"), full_page=True)
    other.close()
    expect(page.locator("#st-state")).to_have_text("succeeded", timeout=180_000)
    expect(page.locator("#run-checkpoints")).to_contain_text("step-00000120.pt")  # sent live, no reload
    expect(page.locator("#run-summary")).to_contain_text("Test accuracy")
    expect(page.locator("#run-config")).to_contain_text("config.toml")
    page.screenshot(path=str(shots / "job.png"), full_page=True)

    # a second run to compare (1 device), while the first is deployed on the other
    second = api.submit({"name": "lr-0.01", "devices": 1, "train": {"model": "convnet", "data": "fashion-mnist",
                                                                       "steps": 60, "batch_size": 64, "lr": 0.01}})  # fmt: skip

    page.get_by_role("link", name="Models").click()
    page.get_by_label("Run", exact=True).select_option(first)
    page.get_by_label("Devices", exact=True).fill("1")
    page.get_by_role("button", name="Deploy").click()
    row = page.locator("tr[data-deployment]").first
    try:
        expect(row.locator("[data-field=status]")).to_have_text("ready", timeout=120_000)
    except AssertionError:  # the page says why (the serve job's own words): put it in the failure
        raise AssertionError(f"the deployment is not ready: {row.inner_text()}") from None
    page.screenshot(path=str(shots / "models.png"), full_page=True)
    row.get_by_role("link", name="Try it").click()
    image = tmp_path / "test-sample.png"
    _fashion_test_image(image, index=0)  # an ankle boot from the test set, as a user would upload it
    page.get_by_label("Image", exact=True).set_input_files(str(image))
    page.get_by_role("button", name="Predict").first.click()
    result = page.locator("section[aria-labelledby=result-h]")
    expect(result.locator("tbody tr")).to_have_count(5)
    expect(result).to_contain_text("ms")
    page.screenshot(path=str(shots / "try.png"), full_page=True)

    wait_state(api, second["id"], "succeeded", timeout=300)
    page.goto(f"{pod.url}/ui/compare?jobs={first},{second['id']}")
    expect(page.get_by_label("Runs", exact=True)).to_contain_text("lr-0.01")
    expect(page.locator("#config-differ")).to_contain_text("lr")
    page.wait_for_function("document.querySelector('figure.chart')?.dataset.points > 0", timeout=30_000)
    page.screenshot(path=str(shots / "compare.png"), full_page=True)

    # stop the deployment from the Models page (with its confirmation)
    page.get_by_role("link", name="Models").click()
    page.get_by_role("button", name=re.compile("Stop deployment")).first.click()
    page.get_by_role("button", name="Stop it").click()
    deployment = api.jobs(name="serve-")[0]
    wait_state(api, deployment["id"], "cancelled", timeout=60)
    dark = signed_in(browser, pod, alice, dark=True)
    dark.goto(f"{pod.url}/ui/jobs/{first}")
    dark.wait_for_function("document.querySelector('#chart-loss').dataset.points > 0")
    dark.screenshot(path=str(shots / "job-dark.png"), full_page=True)
    dark.context.close()
    assert errors == []
    page.context.close()


def test_cancel_isolation_csrf_and_escaping(browser: Any, pod: Pod) -> None:
    from playwright.sync_api import expect

    carol, dave = new_user(pod, "carol"), new_user(pod, "dave")
    api = pod.client(carol)
    page = signed_in(browser, pod, carol)

    # cancel from the page, with its confirmation dialog
    held = api.submit({"name": "sleeper", "command": ["sleep", "300"], "devices": "all"})
    wait_state(api, held["id"], "running")
    page.goto(f"{pod.url}/ui/jobs/{held['id']}")
    page.get_by_role("button", name="Cancel", exact=True).click()
    page.get_by_role("button", name="Cancel it").click()
    expect(page.locator("#st-state")).to_have_text("cancelled", timeout=60_000)

    # markup a job wrote, and markup a user typed, are text
    marked = api.submit({"name": "markup", "command": python_job(
        "print('<script>window.__xss = 1</script><b id=\"boom\">bold</b>', flush=True)")})  # fmt: skip
    wait_state(api, marked["id"], "succeeded")
    page.goto(f"{pod.url}/ui/jobs/{marked['id']}")
    expect(page.locator("#log")).to_contain_text('<b id="boom">bold</b>')
    assert page.locator("#boom").count() == 0 and page.evaluate("window.__xss") is None
    page.goto(
        f"{pod.url}/ui/new?data=fashion-mnist&model=convnet&name=%3Cimg%20src%3Dx%20onerror%3Dwindow.__xss%3D2%3E"
    )
    expect(page.get_by_text("<img src=x onerror=window.__xss=2>").first).to_be_visible()
    assert page.locator("img[src=x]").count() == 0 and page.evaluate("window.__xss") is None

    # a form posted without its CSRF token is refused, with the session cookie and all
    r = page.request.post(f"{pod.url}/ui/jobs/{marked['id']}/requeue", form={"confirmed": "1"})
    assert r.status == 403 and api.job(marked["id"])["state"] == "succeeded"

    # a second user sees nothing of the first's: not in lists, not by URL, not as JSON
    other = signed_in(browser, pod, dave)
    other.goto(f"{pod.url}/ui/jobs")
    assert other.locator(f"tr[data-job='{marked['id']}']").count() == 0
    other.goto(f"{pod.url}/ui/jobs/{marked['id']}")
    expect(other.get_by_role("heading", name="Not found")).to_be_visible()
    r = other.request.get(f"{pod.url}/ui/jobs/{marked['id']}.json")
    assert r.status == 404 and "markup" not in r.text()

    # signed out, everything leads back to sign-in
    other.get_by_role("button", name="Sign out").click()
    other.goto(f"{pod.url}/ui/models")
    assert "/ui/login?next=/ui/models" in other.url
    other.context.close()
    page.context.close()


def _fashion_test_image(path: Path, index: int) -> None:
    from PIL import Image

    from deskpod.environment import Environment
    from deskpod.train.data import fashion_mnist_files, read_idx

    files = fashion_mnist_files(Environment.read().fashion_mnist_dir)
    Image.fromarray(read_idx(files["test_images"])[index].numpy(), mode="L").save(path)


if __name__ == "__main__":  # DESKPOD_SCREENSHOTS=docs/dashboard python -m tests.web.test_e2e
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
