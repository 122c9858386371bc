"""What the nodes run: the node image (its base image and Python, the wheelhouse, the build), and a
lab's own packages, declared, resolved and locked for the node's Python, fetched, and installed as a
package image, one layer on the node image. Below labctl.lab, which brings labs up on these images;
above the engine, whose machine names it uses."""
