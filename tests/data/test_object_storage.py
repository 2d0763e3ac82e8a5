"""A prepared set in object storage, end to end: `python -m diffusion.prepare --out s3://...` and training streamed
from it, against moto's S3 server on the loopback, over https with a certificate this module makes (litdata's
uploader builds its store without `allow_http`, so a plain-http endpoint cannot take its chunks).

Everything that touches the store runs in a subprocess, as users run it: obstore's runtime does not survive a fork,
and a process that used it and then forked (litdata's writers, DataLoader workers) hung; these tests were red that
way (a prepare that never uploaded, a stream whose loading processes never got a chunk)."""

import datetime
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import QUICK, TINY_UNET

BUCKET = "prepared-sets"
DEADLINE_S = 240  # a hang (what these tests guard against) fails here, not at CI's limit


def certificate_pair(folder: Path) -> tuple[Path, Path, Path]:
    """A certificate authority and a server certificate for 127.0.0.1 signed by it: (CA, certificate, key) files.
    rustls (obstore's TLS) refuses a self-signed certificate used as the server's own."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def signed(subject: str, issuer: str, public_key, signer, is_ca: bool):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        )
        if is_ca:
            usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
            builder = builder.add_extension(usage, critical=True)
        else:
            address = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
            builder = builder.add_extension(x509.SubjectAlternativeName([address]), critical=False)
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = signed("test CA", "test CA", ca_key.public_key(), ca_key, is_ca=True)
    server = signed("127.0.0.1", "test CA", key.public_key(), ca_key, is_ca=False)
    paths = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> dict[str, str]:
    """moto's S3 on an https loopback port, one bucket made; the environment a user's commands would have."""
    folder = tmp_path_factory.mktemp("s3")
    ca, certificate, key = certificate_pair(folder)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port), "-c", str(certificate),
         "-k", str(key)],
        stdout=subprocess.DEVNULL, stderr=(folder / "server.log").open("w"),
    )  # fmt: skip
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CA_BUNDLE": str(ca),  # boto3's trust (litdata's listing and downloads)
        "SSL_CERT_FILE": str(ca),  # obstore's (rustls reads the native roots from here)
    }
    try:
        make_bucket = f"import boto3; boto3.client('s3').create_bucket(Bucket={BUCKET!r})"
        for _ in range(100):  # the server up in a second or two
            if (
                subprocess.run([sys.executable, "-c", make_bucket], env=env, capture_output=True).returncode
                == 0
            ):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"moto's S3 server did not start: {(folder / 'server.log').read_text()[-2000:]}")
        yield env
    finally:
        server.kill()
        server.wait()


def run(env: dict[str, str], *argv: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=DEADLINE_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


# One epoch of a prepared set as training streams it: 2 loading processes; each sample's index -> its pixels' sum.
STREAM_ONE_EPOCH = """
import json, sys
from diffusion.data import ImageDataModule
data = ImageDataModule("streaming", root=sys.argv[1], conditional=True, batch_size=32, on_device=False,
                       num_workers=2, cache_dir=sys.argv[2])
sums = {}
for batch in data.training_batches():
    for i, x, label in zip(batch.index.tolist(), batch.x, batch.label.tolist()):
        sums[i] = [round(float(x.sum()), 4), label]
print(data.data_path.split(" from ")[0].split(",")[0])
print(json.dumps(sums))
"""


@pytest.fixture(scope="module")
def digits_in_s3(s3, tmp_path_factory) -> str:
    url = f"s3://{BUCKET}/digits"
    said = run(s3, "-m", "diffusion.prepare", "--out", url, "--num_workers", "2")
    assert f"wrote prepared set {url} (1,707 train, 90 val" in said
    return url


def test_a_set_prepared_into_s3_streams_the_samples_of_the_same_set_prepared_locally(
    s3, digits_in_s3, tmp_path
):
    local = tmp_path / "digits"
    run(s3, "-m", "diffusion.prepare", "--out", str(local), "--num_workers", "2")
    streamed = {}
    for root in (digits_in_s3, str(local)):
        said = run(s3, "-c", STREAM_ONE_EPOCH, root, str(tmp_path / f"cache-{len(streamed)}")).splitlines()
        assert said[-2] == "streamed by litdata", said[-2]
        streamed[root] = json.loads(said[-1])
    assert len(streamed[digits_in_s3]) == 1696  # 53 whole batches of 32 of the 1,707
    assert streamed[digits_in_s3] == streamed[str(local)]


def test_train_py_streams_from_s3_with_loading_processes_and_holds_it_where_it_fits(
    s3, digits_in_s3, tmp_path
):
    common = [
        "train.py", *TINY_UNET, *QUICK, "--data.dataset", "streaming", "--data.root", digits_in_s3,
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
    ]  # fmt: skip
    repo = Path(__file__).parents[2]
    streamed = run(s3, *common, "--data.on_device", "false", "--data.num_workers", "2",
                   "--data.cache_dir", str(tmp_path / "cache"), cwd=repo)  # fmt: skip
    assert "training data: streamed by litdata, 2 loading processes" in streamed
    held = run(s3, *common, cwd=repo)
    assert "training data: held on cpu" in held
    assert len(list((tmp_path / "runs").rglob("last.ckpt"))) == 2
