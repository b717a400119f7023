"""The web console in a real browser (issue 23, point 2): headless Chromium (Debian's chromium
and chromium-driver) driven by Selenium logs in, declares a queue, publishes, sees the count
change, gets the message and purges the queue. Skipped, saying why, where no Chromium or
chromedriver is installed (.ci/run installs them where it can)."""
from __future__ import annotations

import shutil

import pytest

from tests.conftest import stop_cluster
from tests.e2e.management.test_management import call, http_cluster

pytestmark = pytest.mark.e2e

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER),
                              options=opts)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    c = http_cluster(tmp_path_factory.mktemp("shoal-console"),
                     mgmt_port="SHOAL_MANAGEMENT_PORT")
    yield c
    stop_cluster(c)


#: how long a page may take to show something (a bound, not a figure: headless Chromium shares
#: two cores with the other pytest-xdist worker's cluster)
WAIT_S = 60


def text_is(driver, element_id: str, text: str, seconds: float = WAIT_S) -> None:
    WebDriverWait(driver, seconds).until(
        EC.text_to_be_present_in_element((By.ID, element_id), text))
    assert driver.find_element(By.ID, element_id).text == text


def test_log_in_declare_publish_get_and_purge(browser, console, uid):
    d, wait = browser, WebDriverWait(browser, WAIT_S)
    d.get(f"http://127.0.0.1:{console.mgmt_port}/")
    wait.until(EC.visibility_of_element_located((By.ID, "login")))
    d.find_element(By.ID, "login-user").send_keys("guest")
    d.find_element(By.ID, "login-password").send_keys("wrong")
    d.find_element(By.ID, "login-submit").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "login-error"), "Login failed"))
    d.find_element(By.ID, "login-password").clear()
    d.find_element(By.ID, "login-password").send_keys("guest")
    d.find_element(By.ID, "login-submit").click()
    wait.until(EC.visibility_of_element_located((By.ID, "chart")))       # the overview
    assert d.find_element(By.ID, "who").text == "guest"

    q = f"console-{uid}"
    d.find_element(By.ID, "nav-queues").click()
    wait.until(EC.visibility_of_element_located((By.ID, "declare-name"))).send_keys(q)
    d.find_element(By.ID, "declare-submit").click()
    link = wait.until(EC.element_to_be_clickable((By.LINK_TEXT, q)))
    assert call(console, "GET", f"/queues/%2F/{q}")[0] == 200
    link.click()
    text_is(d, "queue-name", q)
    text_is(d, "queue-ready", "0")

    d.find_element(By.ID, "publish-payload").send_keys("hello from the console")
    d.find_element(By.ID, "publish-submit").click()
    text_is(d, "queue-ready", "1")                          # the count changed
    text_is(d, "got", "Message published.")
    d.find_element(By.ID, "publish-submit").click()
    text_is(d, "queue-ready", "2")

    Select(d.find_element(By.ID, "get-ackmode")).select_by_value("ack_requeue_false")
    d.find_element(By.ID, "get-submit").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "got"), "hello from the console"))
    text_is(d, "queue-ready", "1")

    d.find_element(By.ID, "purge").click()
    text_is(d, "queue-ready", "0")
    assert call(console, "GET", f"/queues/%2F/{q}")[1]["messages"] == 0
    assert not d.find_element(By.ID, "error").text

    d.find_element(By.ID, "nav-connections").click()
    wait.until(EC.visibility_of_element_located((By.ID, "connections")))
    d.find_element(By.ID, "nav-exchanges").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "exchanges"), "amq.topic"))


def test_a_quorum_queue_shows_its_type_leader_and_members(browser, console, uid):
    """Issue 35: the console shows each queue's type, and a quorum queue's leader and
    members."""
    q = f"console-qq-{uid}"
    status, body, _ = call(console, "PUT", f"/queues/%2F/{q}",
                           {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    assert status == 201, body
    info = call(console, "GET", f"/queues/%2F/{q}")[1]
    d, wait = browser, WebDriverWait(browser, WAIT_S)
    d.get(f"http://127.0.0.1:{console.mgmt_port}/#/queue/%2F/{q}")
    if d.find_elements(By.ID, "login-user") and \
            d.find_element(By.ID, "login-user").is_displayed():
        d.find_element(By.ID, "login-user").send_keys("guest")
        d.find_element(By.ID, "login-password").send_keys("guest")
        d.find_element(By.ID, "login-submit").click()
        # logged in: the form goes (the page shown is the one asked for, not the overview)
        wait.until(EC.invisibility_of_element_located((By.ID, "login")))
        d.get(f"http://127.0.0.1:{console.mgmt_port}/#/queue/%2F/{q}")
    text_is(d, "queue-name", q)
    text_is(d, "queue-leader", info["leader"])
    text_is(d, "queue-members", ", ".join(info["members"]))
    d.find_element(By.ID, "nav-queues").click()
    wait.until(EC.text_to_be_present_in_element((By.ID, "queues"), "quorum"))
