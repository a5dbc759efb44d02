"""The Beam SDK worker image: its Dockerfile and the requirement files derived from setup.py."""
