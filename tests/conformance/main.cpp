// The conformance binary's entry point; every other file in this folder is compile-time checks only.
int main() {
  return 0;
}
