"""Machine images by short name: which image a machine boots, per CPU architecture.

Catalog data, like the machine types: the AWS provider resolves a short name to
the SSM public parameter of the machine's architecture, and ``spec.environment``
checks ``CLOUDPROF_AWS_IMAGE`` against the same table before anything is paid for.
"""

from __future__ import annotations

from orchestrator import settings
from orchestrator.catalog.machines import machine_arch
from orchestrator.errors import UsageError

# Images by short name → SSM public parameter per CPU architecture. Debian 12 is
# the default, as on GCP: its Python (3.11) runs the workloads wheel as it is.
_UBUNTU = "/aws/service/canonical/ubuntu/server"
AWS_IMAGES: dict[str, dict[str, str]] = {
    "ubuntu-24.04": {
        "x86_64": f"{_UBUNTU}/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id",
        "arm64": f"{_UBUNTU}/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id",
    },
    "ubuntu-22.04": {
        "x86_64": f"{_UBUNTU}/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id",
        "arm64": f"{_UBUNTU}/22.04/stable/current/arm64/hvm/ebs-gp2/ami-id",
    },
    "debian-12": {
        "x86_64": "/aws/service/debian/release/12/latest/amd64",
        "arm64": "/aws/service/debian/release/12/latest/arm64",
    },
    "al2023": {
        "x86_64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64",
        "arm64": "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-arm64",
    },
}
AWS_DEFAULT_IMAGE = "debian-12"


def aws_image_parameter(image: str | None, machine: str) -> str | None:
    """SSM parameter for ``image`` (short name, parameter path); None for a literal AMI id."""
    image = image or settings.AWS_IMAGE.get() or AWS_DEFAULT_IMAGE
    if image.startswith("ami-"):
        return None
    if image.startswith("/"):
        return image
    if image not in AWS_IMAGES:
        raise UsageError(
            f"unknown AWS image {image!r}: use one of {', '.join(AWS_IMAGES)}, "
            "an SSM parameter path (/aws/service/...) or an AMI id (ami-...)"
        )
    return AWS_IMAGES[image][machine_arch("aws", machine)]  # Graviton machines boot arm64
