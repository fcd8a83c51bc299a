"""IR passes, each one module with one public function taking and returning a Graph."""
