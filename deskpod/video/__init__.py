"""Video analytics: many camera streams indexed at once, a face searched by photo, objects found."""
