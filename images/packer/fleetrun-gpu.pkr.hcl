# A baked fleetrun node image, from the same deep-learning images the stacks boot by default.
#
#   packer init images/packer
#   packer build -only='amazon-ebs.dlami' -var aws_region=us-east-1 images/packer
#   packer build -only='googlecompute.dlvm' -var gcp_project=my-project images/packer
#
# Then point a stack at it: `fleet:image: ami-...` (AWS) or
# `fleet:image: projects/<project>/global/images/family/fleetrun-gpu` (GCP). Baking saves the
# first-boot work (packages, sshd limits); each node still gets its own pinned host key from its
# cloud-init user data, so the image carries no host keys at all.

packer {
  required_plugins {
    amazon = {
      version = ">= 1.3.0"
      source  = "github.com/hashicorp/amazon"
    }
    googlecompute = {
      version = ">= 1.1.0"
      source  = "github.com/hashicorp/googlecompute"
    }
  }
}

variable "aws_region" {
  type    = string
  default = "us-east-1"
}

variable "aws_build_instance_type" {
  type        = string
  default     = "m5.xlarge"
  description = "The build needs no GPU: drivers come with the base image"
}

variable "gcp_project" {
  type    = string
  default = ""
}

variable "gcp_zone" {
  type    = string
  default = "us-central1-a"
}

variable "disk_size_gb" {
  type    = number
  default = 200
}

locals {
  stamp = formatdate("YYYYMMDD-hhmm", timestamp())
  name  = "fleetrun-gpu-${local.stamp}"
}

source "amazon-ebs" "dlami" {
  region        = var.aws_region
  instance_type = var.aws_build_instance_type
  source_ami_filter {
    filters = {
      name                = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu *)"
      architecture        = "x86_64"
      virtualization-type = "hvm"
      state               = "available"
    }
    owners      = ["amazon"]
    most_recent = true
  }
  ssh_username = "ubuntu"
  ami_name     = local.name
  encrypt_boot = true
  imds_support = "v2.0"
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 2
  }
  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = var.disk_size_gb
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
  }
  tags = {
    Name             = local.name
    "fleetrun:image" = "gpu"
  }
}

source "googlecompute" "dlvm" {
  project_id              = var.gcp_project
  zone                    = var.gcp_zone
  source_image_family     = "pytorch-2-7-cu128-ubuntu-2204-nvidia-570"
  source_image_project_id = ["deeplearning-platform-release"]
  machine_type            = "n2-standard-8"
  disk_size               = var.disk_size_gb
  disk_type               = "pd-balanced"
  ssh_username            = "packer"
  image_name              = local.name
  image_family            = "fleetrun-gpu"
  image_labels = {
    fleetrun-image = "gpu"
  }
  enable_vtpm                 = true
  enable_integrity_monitoring = true
}

build {
  sources = ["source.amazon-ebs.dlami", "source.googlecompute.dlvm"]

  provisioner "file" {
    source      = "${path.root}/../cloud-init/sshd-fleetrun.conf"
    destination = "/tmp/01-fleetrun.conf"
  }

  provisioner "file" {
    source      = "${path.root}/../cloud-init/fleetrun-bootstrap.sh"
    destination = "/tmp/fleetrun-bootstrap"
  }

  provisioner "shell" {
    script          = "${path.root}/provision.sh"
    execute_command = "chmod +x '{{ .Path }}' && sudo -E bash '{{ .Path }}'"
  }
}
